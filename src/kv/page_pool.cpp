#include "kv/page_pool.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "common/error.h"

namespace kvq {

namespace {
double mib(double bytes) { return bytes / double(1 << 20); }
}  // namespace

PagePool::Size PagePool::for_sequences(const CacheLayout& layout, int max_ctx, int max_seqs) {
  KVQ_CHECK(max_ctx > 0 && max_seqs > 0, "KV cache: bad sizes (ctx {}, seqs {})", max_ctx, max_seqs);
  const int64_t pages = (int64_t(layout.pages_per_seq(max_ctx)) + layout.window_pages()) * max_seqs;
  KVQ_CHECK(pages <= INT32_MAX, "KV cache: {} sequences of {} tokens need {} pages (at most 2^31 - 1)", max_seqs,
            max_ctx, pages);
  return {max_seqs, int(pages)};
}

PagePool::Size PagePool::for_budget(const CacheLayout& layout, int max_ctx, int max_seqs, size_t budget_bytes) {
  KVQ_CHECK(max_ctx > 0 && max_seqs >= 0, "KV cache: bad sizes (ctx {}, seqs {})", max_ctx, max_seqs);
  const int64_t budget = int64_t(std::min<size_t>(budget_bytes, INT64_MAX));
  const int64_t pages = std::min<int64_t>(budget / std::max<int64_t>(layout.page_bytes, 1), INT32_MAX);
  const int one_seq = layout.sequence_pages(max_ctx);
  KVQ_CHECK(pages >= one_seq,
            "KV cache: a budget of {:.1f} MiB does not hold one sequence of {} tokens ({} pages of {:.2f} MiB: {} for "
            "its windows, {} for its tokens)",
            mib(double(budget)), max_ctx, one_seq, mib(double(layout.page_bytes)), layout.window_pages(),
            layout.pages_for(max_ctx));
  if (max_seqs == 0) max_seqs = int(pages / one_seq);
  return {max_seqs, int(std::min<int64_t>(pages, for_sequences(layout, max_ctx, max_seqs).n_pages))};
}

PagePool::PagePool(const CacheLayout& layout, int max_ctx, Size size)
    : layout_(layout), max_ctx_(max_ctx), n_pages_(size.n_pages), width_(std::max(1, layout.pages_per_seq(max_ctx))) {
  KVQ_CHECK(max_ctx > 0 && size.n_slots > 0 && size.n_pages >= 0, "KV cache: bad sizes (ctx {}, seqs {}, pages {})",
            max_ctx, size.n_slots, size.n_pages);
  for (int i = 0; i < n_pages_; ++i) free_.insert(free_.end(), i);  // page 0 is taken first
  seq_refs_.assign(size_t(n_pages_), 0);
  cache_refs_.assign(size_t(n_pages_), 0);
  table_.assign(size_t(size.n_slots) * size_t(width_), -1);
  held_.assign(size_t(size.n_slots), 0);
  length_.assign(size_t(size.n_slots), 0);
  live_.assign(size_t(size.n_slots), false);
  window_.assign(size_t(size.n_slots), -1);
}

int PagePool::window_run(bool evictable) const {
  const int need = layout_.window_pages();
  if ((evictable ? free_pages() : int(free_.size())) < need) return -1;
  for (int p = n_pages_ - 1, run = 0; p >= 0; --p) {
    run = seq_refs_[size_t(p)] == 0 && (evictable || cache_refs_[size_t(p)] == 0) ? run + 1 : 0;
    if (run == need) return p;
  }
  return -1;
}

int PagePool::open() {
  const auto slot = std::find(live_.begin(), live_.end(), false);
  KVQ_CHECK(slot != live_.end(), "KV cache: all {} sequence slots are in use", n_slots());
  const int seq = int(slot - live_.begin()), need = layout_.window_pages();
  int first = window_run(false);
  while (first < 0 && evict_ && window_run(true) >= 0 && evict_()) first = window_run(false);
  KVQ_CHECK(first >= 0,
            "KV cache: page pool exhausted: a sequence's windows need {} pages in a row ({:.1f} MiB), {} free of {}{}",
            need, mib(double(need) * double(layout_.page_bytes)), free_pages(), n_pages_,
            free_pages() >= need ? " but not in a row" : "");
  for (int p = first; p < first + need; ++p) {
    free_.erase(p);
    seq_refs_[size_t(p)] = 1;
  }
  window_[size_t(seq)] = first;
  live_[size_t(seq)] = true;
  length_[size_t(seq)] = 0;
  return seq;
}

int64_t PagePool::window_offset(int seq) const {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)], "KV cache: sequence {} is not live", seq);
  return layout_.window_offset(window_[size_t(seq)]);
}

void PagePool::release_page(int page) {
  int& refs = seq_refs_[size_t(page)];
  KVQ_CHECK(refs > 0, "KV cache: page {} released with no sequence holding it (internal)", page);
  if (--refs > 0) return;
  if (cache_refs_[size_t(page)] > 0) ++cached_only_;
  else free_.insert(page);
}

int PagePool::pop_free() {
  while (free_.empty() && evict_ && cached_only_ > 0 && evict_()) {
  }
  KVQ_CHECK(!free_.empty(), "KV cache: page pool exhausted: no free page of {} (internal: the count said one was)",
            n_pages_);
  const int page = *free_.begin();
  free_.erase(free_.begin());
  seq_refs_[size_t(page)] = 1;
  return page;
}

void PagePool::share(int seq, int page) {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)], "KV cache: sequence {} is not live", seq);
  KVQ_CHECK(page >= 0 && page < n_pages_ && (seq_refs_[size_t(page)] > 0 || cache_refs_[size_t(page)] > 0),
            "KV cache: page {} is not held, it cannot be shared", page);
  KVQ_CHECK(held_[size_t(seq)] < width_, "KV cache: sequence {} holds {} pages already", seq, width_);
  if (seq_refs_[size_t(page)]++ == 0) --cached_only_;
  table_[size_t(seq) * size_t(width_) + size_t(held_[size_t(seq)]++)] = page;
}

int PagePool::take_page(int seq) {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)], "KV cache: sequence {} is not live", seq);
  KVQ_CHECK(held_[size_t(seq)] < width_, "KV cache: sequence {} holds {} pages already", seq, width_);
  KVQ_CHECK(free_pages() > 0, "KV cache: page pool exhausted: sequence {} needs a page, none free of {}", seq,
            n_pages_);
  const int page = pop_free();
  table_[size_t(seq) * size_t(width_) + size_t(held_[size_t(seq)]++)] = page;
  return page;
}

void PagePool::set_length(int seq, int n_tokens) {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)] && n_tokens >= 0 && n_tokens <= max_ctx_ &&
                layout_.pages_for(n_tokens) <= held_[size_t(seq)],
            "KV cache: sequence {} cannot hold {} tokens in {} pages", seq, n_tokens, held_.at(size_t(seq)));
  length_[size_t(seq)] = n_tokens;
}

void PagePool::cache_ref(int page, int delta) {
  KVQ_CHECK(page >= 0 && page < n_pages_ && (delta == 1 || delta == -1), "KV cache: cache_ref({}, {})", page, delta);
  int& refs = cache_refs_[size_t(page)];
  if (delta > 0) {
    KVQ_CHECK(seq_refs_[size_t(page)] > 0 || refs > 0, "KV cache: a free page {} cannot be cached", page);
    ++refs;
    return;
  }
  KVQ_CHECK(refs > 0, "KV cache: page {} has no cache reference to drop", page);
  if (--refs > 0 || seq_refs_[size_t(page)] > 0) return;
  --cached_only_;
  free_.insert(page);
}

void PagePool::close(int seq) {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)], "KV cache: sequence {} is not live", seq);
  int* row = table_.data() + size_t(seq) * size_t(width_);
  for (int i = held_[size_t(seq)] - 1; i >= 0; --i) release_page(std::exchange(row[i], -1));
  for (int p = window_[size_t(seq)]; p < window_[size_t(seq)] + layout_.window_pages(); ++p) release_page(p);
  window_[size_t(seq)] = -1;
  held_[size_t(seq)] = length_[size_t(seq)] = 0;
  live_[size_t(seq)] = false;
}

int PagePool::n_live() const { return int(std::count(live_.begin(), live_.end(), true)); }

int PagePool::pages_short(int seq, int n_tokens) const {
  return std::max(0, layout_.pages_for(n_tokens) - pages(seq));
}

void PagePool::reserve(const std::vector<int>& seqs, const std::vector<int>& n_new) {
  KVQ_CHECK(seqs.size() == n_new.size(), "KV cache: reserve of {} sequences with {} counts", seqs.size(), n_new.size());
  int short_total = 0;
  std::string short_seqs;
  std::vector<bool> seen(size_t(n_slots()), false);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int s = seqs[b], n = n_new[b];
    KVQ_CHECK(s >= 0 && s < n_slots() && live_[size_t(s)], "KV cache: sequence {} is not live", s);
    KVQ_CHECK(!seen[size_t(s)], "KV cache: sequence {} appears twice in one reserve", s);
    seen[size_t(s)] = true;
    KVQ_CHECK(n >= 0, "KV cache: reserve of {} tokens for sequence {}", n, s);
    KVQ_CHECK(n <= layout_.max_chunk, "KV cache: chunk of {} tokens exceeds the ring's chunk size {}", n,
              layout_.max_chunk);
    const int end = length_[size_t(s)] + n;
    KVQ_CHECK(end <= max_ctx_, "context overflow: {} tokens exceed the cache's context of {} tokens", end, max_ctx_);
    if (const int p = pages_short(s, end); p > 0) {
      short_total += p;
      short_seqs += (short_seqs.empty() ? "" : ", ") + std::to_string(s);
    }
  }
  KVQ_CHECK(short_total <= free_pages(),
            "KV cache: page pool exhausted: sequence{} {} need{} {} more page{}, {} free of {} ({:.1f} MiB)",
            short_seqs.find(',') == std::string::npos ? "" : "s", short_seqs,
            short_seqs.find(',') == std::string::npos ? "s" : "", short_total, short_total == 1 ? "" : "s",
            free_pages(), n_pages_, mib(double(n_pages_) * double(layout_.page_bytes)));
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int s = seqs[b], need = layout_.pages_for(length_[size_t(s)] + n_new[b]);
    int* row = table_.data() + size_t(s) * size_t(width_);
    for (int& held = held_[size_t(s)]; held < need; ++held) row[held] = pop_free();
  }
}

void PagePool::fork(int src, int dst) {
  KVQ_CHECK(src >= 0 && src < n_slots() && live_[size_t(src)] && dst >= 0 && dst < n_slots() && live_[size_t(dst)] &&
                src != dst,
            "KV cache: fork of sequence {} into {}: both must be live and different", src, dst);
  KVQ_CHECK(length_[size_t(dst)] == 0 && held_[size_t(dst)] == 0, "KV cache: fork into sequence {}, which holds {} "
            "tokens", dst, length_[size_t(dst)]);
  const int need = held_[size_t(src)];
  KVQ_CHECK(need <= free_pages(), "KV cache: page pool exhausted: a fork of sequence {} needs {} pages, {} free of {}",
            src, need, free_pages(), n_pages_);
  int* row = table_.data() + size_t(dst) * size_t(width_);
  for (int i = 0; i < need; ++i) row[i] = pop_free();
  held_[size_t(dst)] = need;
  length_[size_t(dst)] = length_[size_t(src)];
}

bool PagePool::can_open() const { return n_live() < n_slots() && window_run(true) >= 0; }

bool PagePool::can_admit(int n_tokens) const {
  return n_tokens <= max_ctx_ && layout_.sequence_pages(n_tokens) <= free_pages() && can_open();
}

int PagePool::sequences_at(int n_tokens) const {
  return std::min(n_slots(), n_pages_ / layout_.sequence_pages(std::min(n_tokens, max_ctx_)));
}

size_t PagePool::bytes_of(const CacheLayout& layout, Size size) {
  return size_t(size.n_pages) * size_t(layout.page_bytes);
}

size_t PagePool::bytes() const { return bytes_of(layout_, {n_slots(), n_pages_}); }

size_t PagePool::used_bytes() const { return size_t(used_pages()) * size_t(layout_.page_bytes); }

}  // namespace kvq
