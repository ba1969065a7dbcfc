// The page pool of a KV cache, host side: the one bookkeeping of pages and sequence slots that the CPU cache
// (KvCache) and the GPU cache (cuda::GpuKvCache) both use, and the admission arithmetic a scheduler reads.
// It holds no cache bytes: a cache stores page p at pool + p * page_bytes and the windows of slot s per slot,
// and reads (GPU: uploads) the block tables from here.
//
// Sizes are fixed at construction, in bytes: every slot's windows (sinks + ring, CacheLayout::window_bytes) and
// n_pages pages (CacheLayout::page_bytes). A sequence takes pages as it grows (reserve), so the sequences that fit
// are the ones the pool really holds. Windows are allocated per slot, not per live sequence, because the GPU kernels
// address them by slot.
//
// Prefix caching (kv/prefix_cache.h) shares pages: a page may be in several sequences' block tables (read-only) and
// held by cached prefixes. Each page counts its sequence references and its cache references and is free when both
// are zero. free_pages() counts the pages that only cached prefixes hold as free too: taking pages (reserve, fork,
// take_page) evicts cached prefixes through the evictor, least recently used first, until the free list has them.
#pragma once

#include <cstddef>
#include <functional>
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
  // Enough pages for max_seqs sequences of max_ctx tokens each (max_seqs x layout.pages_per_seq(max_ctx)).
  static Size for_sequences(const CacheLayout& layout, int max_ctx, int max_seqs);
  // What fits in budget_bytes: the windows of max_seqs slots, then as many pages as the rest holds, at most
  // for_sequences' count. max_seqs 0: as many slots as the budget holds sequences of max_ctx tokens (windows and
  // pages). Throws kvq::Error unless the budget holds every slot's windows and one sequence of max_ctx.
  static Size for_budget(const CacheLayout& layout, int max_ctx, int max_seqs, size_t budget_bytes);
  // Bytes of a pool of this size: its pages and every slot's windows.
  static size_t bytes_of(const CacheLayout& layout, Size size);

  PagePool(const CacheLayout& layout, int max_ctx, Size size);

  const CacheLayout& layout() const { return layout_; }
  int max_ctx() const { return max_ctx_; }
  int n_slots() const { return int(length_.size()); }
  int n_pages() const { return n_pages_; }
  int table_width() const { return width_; }  // block table columns: max(1, layout.pages_per_seq(max_ctx))

  // Sequence slots. open() takes the lowest free slot (throws when all are in use); close() returns its pages.
  int open();
  void close(int seq);
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

  // Admission: a free slot and free pages for a sequence of n_tokens (<= max_ctx).
  bool can_admit(int n_tokens) const;
  // Sequences of n_tokens each that the empty pool holds (its slots, or its pages).
  int sequences_at(int n_tokens) const;
  int free_pages() const { return int(free_.size()) + cached_only_; }  // cached-only pages included
  int used_pages() const { return n_pages_ - free_pages(); }
  size_t bytes() const;       // pages + every slot's windows: what the cache allocates
  size_t used_bytes() const;  // pages held + windows of live sequences
  size_t free_bytes() const { return bytes() - used_bytes(); }

 private:
  CacheLayout layout_;
  int max_ctx_, n_pages_, width_;
  void release_page(int page);  // a sequence drops its reference
  int pop_free();                // a free page id, evicting cached prefixes when the list is empty
  std::vector<int> free_;     // free page ids; the next one taken is back()
  std::vector<int> seq_refs_, cache_refs_;  // [n_pages] references by sequences / by cached prefixes
  int cached_only_ = 0;        // pages with cache references only
  std::function<bool()> evict_;
  std::vector<int> table_;    // [n_slots][width_] block tables, -1: none
  std::vector<int> held_;     // pages held per slot
  std::vector<int> length_;   // tokens committed per slot
  std::vector<bool> live_;
};

}  // namespace kvq
