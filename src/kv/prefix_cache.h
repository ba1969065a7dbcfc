// Prefix caching over the paged cache: the state of a sequence at a prompt position, kept after the sequence has
// moved on or ended, so that a later prompt with the same tokens continues from there instead of prefilling them.
//
// A decode-faithful sequence at length L is: its sinks [0, S0), the pages of its quantized region [S0, qe(L - 1)) and
// the window rows of [qe(L - 1), L) in its ring (kv/cache.h). Every page wholly below qe(L - 1) is final — demotion
// never writes to it again — and its bytes depend only on the tokens [0, page end) (each row is what decode would
// hold, whatever else ran: docs/guide/design.md), so it is shared read-only: the entry holds a cache reference on it
// (PagePool::cache_ref) and a sequence that continues from the entry takes it into its block table (PagePool::share).
// The rest — the sink rows, the partly filled last page and the recent window rows (and the body rows of quantized
// windows) — is copied: into the entry at store time, out of it at attach time, so that every sequence owns its ring
// and the pages it still writes.
//
// Entries are addressed by their content: a 64-bit chain hash of the cache's configuration key (codecs, windows, page
// and chunk sizes, rotation, model shape: KvCache and GpuKvCache build it) and the token ids [0, L); a hit compares the
// ids themselves. Entries are taken at multiples of the prefill chunk (the scheduler stores one after each full chunk
// of a prompt), so a sequence that continues from one feeds exactly the chunks a fresh run feeds after L: on the CPU
// its pages, windows and logits are byte-for-byte a fresh run's (tests/test_prefix_cache.cpp). Entries are evicted
// least recently used first when the pool needs pages (PagePool's evictor) or their copied bytes pass max_bytes.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kv/page_pool.h"

namespace kvq {

// What /metrics and the logs report of a prefix cache.
struct PrefixCacheStats {
  bool enabled = false;
  int64_t entries = 0;          // cached prefixes
  int64_t state_bytes = 0;      // their copied bytes (windows, partial pages), outside the page pool
  int64_t pages = 0;            // pages only cached prefixes hold (reclaimable)
  int64_t hit_tokens = 0;       // prompt tokens taken from the cache (usage.prompt_tokens_details.cached_tokens)
  int64_t miss_tokens = 0;      // prompt tokens of admitted requests that were prefilled
  int64_t evictions = 0;        // entries evicted
};

class PrefixCache {
 public:
  // pool: the cache's page pool (it must outlive this); config_key: the cache configuration's hash; max_bytes: the
  // copied bytes kept at most. Installs itself as the pool's evictor.
  PrefixCache(PagePool& pool, uint64_t config_key, int64_t max_bytes);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Entry {
    std::vector<int32_t> ids;    // the tokens [0, len)
    std::vector<int> pages;      // the final pages of the quantized region (cache references held)
    std::vector<uint8_t> state;  // the copied rest, laid out by the cache that stored it
    std::list<uint64_t>::iterator lru;
  };
  // The largest len, a multiple of step in (0, max_len], with an entry for ids [0, len); 0 when none.
  int longest(const int32_t* ids, int max_len, int step) const;
  // The entry of ids [0, len), marked most recently used; null when none.
  const Entry* find(const int32_t* ids, int len);
  bool contains(const int32_t* ids, int len) const;
  // Stores an entry (a cache reference on each page; the caller keeps its own); an existing one is only touched.
  void insert(const int32_t* ids, int len, std::vector<int> pages, std::vector<uint8_t> state);
  // Drops the least recently used entry (its page references); false when there is none.
  bool evict_one();
  void clear();

  void count(int hit_tokens, int miss_tokens) { hits_ += hit_tokens, misses_ += miss_tokens; }
  PrefixCacheStats stats() const;
  // FNV-1a over 64-bit words: the configuration key and the ids [0, len).
  static uint64_t hash(uint64_t config_key, const int32_t* ids, int len);

 private:
  PagePool& pool_;
  uint64_t key_;
  int64_t max_bytes_, bytes_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0;
  std::unordered_multimap<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // hashes, least recently used first (an entry's lru points into it)
  void drop(std::unordered_multimap<uint64_t, Entry>::iterator it);
};

}  // namespace kvq
