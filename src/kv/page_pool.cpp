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
  const int64_t pages = int64_t(layout.pages_per_seq(max_ctx)) * max_seqs;
  KVQ_CHECK(pages <= INT32_MAX, "KV cache: {} sequences of {} tokens need {} pages (at most 2^31 - 1)", max_seqs,
            max_ctx, pages);
  return {max_seqs, int(pages)};
}

PagePool::Size PagePool::for_budget(const CacheLayout& layout, int max_ctx, int max_seqs, size_t budget_bytes) {
  KVQ_CHECK(max_ctx > 0 && max_seqs >= 0, "KV cache: bad sizes (ctx {}, seqs {})", max_ctx, max_seqs);
  const int64_t budget = int64_t(std::min<size_t>(budget_bytes, INT64_MAX));
  const int64_t one_seq = layout.sequence_bytes(max_ctx);
  if (max_seqs == 0) max_seqs = int(std::min<int64_t>(budget / std::max<int64_t>(one_seq, 1), INT32_MAX));
  const int64_t windows = int64_t(max_seqs) * layout.window_bytes();
  KVQ_CHECK(max_seqs > 0 && windows + layout.pages_for(max_ctx) * layout.page_bytes <= budget,
            "KV cache: a budget of {:.1f} MiB does not hold the windows of {} sequence slot{} ({:.1f} MiB) and the "
            "pages of one sequence of {} tokens ({} x {:.2f} MiB)",
            mib(double(budget)), std::max(max_seqs, 1), max_seqs > 1 ? "s" : "",
            mib(double(std::max(max_seqs, 1)) * layout.window_bytes()), max_ctx, layout.pages_for(max_ctx),
            mib(double(layout.page_bytes)));
  const Size most = for_sequences(layout, max_ctx, max_seqs);
  const int64_t pages = layout.page_bytes > 0 ? (budget - windows) / layout.page_bytes : most.n_pages;
  return {max_seqs, int(std::min<int64_t>(pages, most.n_pages))};
}

PagePool::PagePool(const CacheLayout& layout, int max_ctx, Size size)
    : layout_(layout), max_ctx_(max_ctx), n_pages_(size.n_pages), width_(std::max(1, layout.pages_per_seq(max_ctx))) {
  KVQ_CHECK(max_ctx > 0 && size.n_slots > 0 && size.n_pages >= 0, "KV cache: bad sizes (ctx {}, seqs {}, pages {})",
            max_ctx, size.n_slots, size.n_pages);
  free_.resize(size_t(n_pages_));
  for (int i = 0; i < n_pages_; ++i) free_[size_t(i)] = n_pages_ - 1 - i;  // page 0 is taken first
  table_.assign(size_t(size.n_slots) * size_t(width_), -1);
  held_.assign(size_t(size.n_slots), 0);
  length_.assign(size_t(size.n_slots), 0);
  live_.assign(size_t(size.n_slots), false);
}

int PagePool::open() {
  for (int i = 0; i < n_slots(); ++i) {
    if (live_[size_t(i)]) continue;
    live_[size_t(i)] = true;
    length_[size_t(i)] = 0;
    return i;
  }
  KVQ_FAIL("KV cache: all {} sequence slots are in use", n_slots());
}

void PagePool::close(int seq) {
  KVQ_CHECK(seq >= 0 && seq < n_slots() && live_[size_t(seq)], "KV cache: sequence {} is not live", seq);
  int* row = table_.data() + size_t(seq) * size_t(width_);
  for (int i = held_[size_t(seq)] - 1; i >= 0; --i) free_.push_back(std::exchange(row[i], -1));
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
    for (int& held = held_[size_t(s)]; held < need; ++held) {
      row[held] = free_.back();
      free_.pop_back();
    }
  }
}

bool PagePool::can_admit(int n_tokens) const {
  return n_tokens <= max_ctx_ && n_live() < n_slots() && layout_.pages_for(n_tokens) <= free_pages();
}

int PagePool::sequences_at(int n_tokens) const {
  const int pages = layout_.pages_for(std::min(n_tokens, max_ctx_));
  return pages > 0 ? std::min(n_slots(), n_pages_ / pages) : n_slots();
}

size_t PagePool::bytes_of(const CacheLayout& layout, Size size) {
  return size_t(size.n_pages) * size_t(layout.page_bytes) + size_t(size.n_slots) * size_t(layout.window_bytes());
}

size_t PagePool::bytes() const { return bytes_of(layout_, {n_slots(), n_pages_}); }

size_t PagePool::used_bytes() const {
  return size_t(used_pages()) * size_t(layout_.page_bytes) + size_t(n_live()) * size_t(layout_.window_bytes());
}

}  // namespace kvq
