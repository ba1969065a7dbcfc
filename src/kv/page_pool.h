// The page pool of a KV cache, host side: the one bookkeeping of pages and sequence slots that the CPU cache
// (KvCache) and the GPU cache (cuda::GpuKvCache) both use, and the admission arithmetic a scheduler reads.
// It holds no cache bytes: a cache stores page p at pool + p * page_bytes and reads (GPU: uploads) the block tables
// and the window offsets from here.
//
// Sizes are fixed at construction: n_pages pages (CacheLayout::page_bytes) and n_slots sequence slots, which cost
// nothing but a block-table row. A sequence takes everything it stores from the pages: its windows (sinks + ring,
// CacheLayout::window_pages() pages in a row) when it opens, the pages of its quantized region as it grows (reserve),
// and returns them all when it closes; so the sequences that fit are decided by what live sequences hold. Body pages
// are taken lowest id first and windows from the top of the pool down, so the two meet only when the pool is nearly
// full; a window needs its pages in a row, so a fragmented pool can refuse a sequence with enough free pages in all
// (can_admit says so, and open() names it).
//
// Prefix caching (kv/prefix_cache.h) shares pages: a page may be in several sequences' block tables (read-only) and
// held by cached prefixes. Each page counts its sequence references and its cache references and is free when both
// are zero. free_pages() counts the pages that only cached prefixes hold as free too: taking pages (reserve, fork,
// take_page) evicts cached prefixes through the evictor, least recently used first, until the free list has them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "kv/cache_layout.h"

namespace kvq {

class PagePool {
 public:
  // Slots and pages of a pool.
  struct Size {
    int n_slots;  // sequence slots
    int n_pages;  // pages
  };
  // Enough pages for max_seqs sequences of max_ctx tokens each, windows included (max_seqs x
  // layout.sequence_pages(max_ctx)).
  static Size for_sequences(const CacheLayout& layout, int max_ctx, int max_seqs);
  // As many pages as budget_bytes holds, at most for_sequences' count, and max_seqs slots; max_seqs 0: as many slots
  // as the budget holds sequences of max_ctx tokens. Throws kvq::Error unless the budget holds one sequence of max_ctx
  // (its windows and pages).
  static Size for_budget(const CacheLayout& layout, int max_ctx, int max_seqs, size_t budget_bytes);
  // Bytes of a pool of this size: its pages (the windows are pages too).
  static size_t bytes_of(const CacheLayout& layout, Size size);

  PagePool(const CacheLayout& layout, int max_ctx, Size size);

  const CacheLayout& layout() const { return layout_; }
  int max_ctx() const { return max_ctx_; }
  int n_slots() const { return int(length_.size()); }
  int n_pages() const { return n_pages_; }
  int table_width() const { return width_; }  // block table columns: max(1, layout.pages_per_seq(max_ctx))

  // Sequence slots. open() takes the lowest free slot and its windows' pages (throws kvq::Error when every slot is in
  // use, or no window_pages() pages in a row are free, evicting cached prefixes first); close() returns its pages.
  int open();
  void close(int seq);
  // The byte offset in the pool of seq's windows (CacheLayout::window_offset of its first window page); seq live.
  int64_t window_offset(int seq) const;
  bool live(int seq) const { return live_.at(size_t(seq)); }
  int n_live() const;
  int length(int seq) const { return length_.at(size_t(seq)); }  // tokens committed
  void commit(int seq, int n_tokens) { length_.at(size_t(seq)) += n_tokens; }

  // Block tables: page i of seq (quantized positions [S0 + i P, S0 + (i + 1) P)), and all of them at once,
  // [n_slots][table_width] page ids, -1 where a sequence holds no page.
  int pages(int seq) const { return held_.at(size_t(seq)); }
  int page(int seq, int i) const { return table_[size_t(seq) * size_t(width_) + size_t(i)]; }
  const std::vector<int>& table() const { return table_; }

  // Pages for what positions [length, length + n_new) of each seqs[b] will demote. Checks every sequence first
  // (live, 0 <= n_new <= max_chunk, no context overflow, enough free pages in all) and throws kvq::Error before
  // anything changes, e.g. "KV cache: page pool exhausted: sequence 3 needs 2 more pages, 1 free of 64 (9.0 MiB)".
  void reserve(const std::vector<int>& seqs, const std::vector<int>& n_new);
  void reserve(int seq, int n_new) { reserve(std::vector<int>{seq}, std::vector<int>{n_new}); }
  // Makes dst (live, empty) the same length as src with as many pages of its own, in the same table order: the
  // caller copies the page contents (a fork, n > 1 choices of one prompt). Throws kvq::Error before anything changes
  // when the pool lacks the pages.
  void fork(int src, int dst);
  // Prefix caching. share: appends page (held by a cached prefix or a sequence) to seq's block table; take_page:
  // appends a free page (evicting cached prefixes when none is) and returns it; set_length: the tokens seq holds (after
  // attaching a cached prefix). cache_ref: a cached prefix takes (+1) or drops (-1) a reference on a page.
  void share(int seq, int page);
  int take_page(int seq);
  void set_length(int seq, int n_tokens);
  void cache_ref(int page, int delta);
  int seq_refs(int page) const { return seq_refs_.at(size_t(page)); }
  int cache_refs(int page) const { return cache_refs_.at(size_t(page)); }
  int cached_pages() const { return cached_only_; }  // pages only cached prefixes hold
  // Frees cached prefixes, least recently used first; returns false when nothing is left to free.
  void set_evictor(std::function<bool()> evict_one) { evict_ = std::move(evict_one); }
  // More pages seq needs to hold n_tokens tokens in all.
  int pages_short(int seq, int n_tokens) const;

  // Admission: a free slot, its windows' pages in a row and free pages for a sequence of n_tokens (<= max_ctx), with
  // cached prefixes evicted where needed.
  bool can_admit(int n_tokens) const;
  // A new sequence can open: a free slot and a run of window pages (cached prefixes evicted where needed).
  bool can_open() const;
  // Sequences of n_tokens each that the empty pool holds (its slots, or its pages, windows included).
  int sequences_at(int n_tokens) const;
  int free_pages() const { return int(free_.size()) + cached_only_; }  // cached-only pages included
  int used_pages() const { return n_pages_ - free_pages(); }          // windows of live sequences included
  size_t bytes() const;       // every page: what the cache allocates
  size_t used_bytes() const;  // pages held, windows included
  size_t free_bytes() const { return bytes() - used_bytes(); }

 private:
  CacheLayout layout_;
  int max_ctx_, n_pages_, width_;
  void release_page(int page);  // a sequence drops its reference
  int pop_free();                // the lowest free page id, evicting cached prefixes when none is free
  // The first page of the highest run of window_pages() pages that are free (or, with evictable, that no sequence
  // holds: free or cached-only), -1 when there is none.
  int window_run(bool evictable) const;
  std::set<int> free_;        // free page ids; the next one taken is the lowest
  std::vector<int> seq_refs_, cache_refs_;  // [n_pages] references by sequences / by cached prefixes
  int cached_only_ = 0;        // pages with cache references only
  std::function<bool()> evict_;
  std::vector<int> table_;    // [n_slots][width_] block tables, -1: none
  std::vector<int> held_;     // pages held per slot
  std::vector<int> length_;   // tokens committed per slot
  std::vector<int> window_;   // first window page per slot, -1: none
  std::vector<bool> live_;
};

}  // namespace kvq
