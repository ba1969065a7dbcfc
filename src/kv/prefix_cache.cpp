#include "kv/prefix_cache.h"

#include <algorithm>

#include "common/error.h"

namespace kvq {

uint64_t PrefixCache::hash(uint64_t config_key, const int32_t* ids, int len) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis
  auto mix = [&](uint64_t word) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((word >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  mix(config_key);
  mix(uint64_t(len));
  for (int i = 0; i < len; ++i) mix(uint64_t(uint32_t(ids[i])));
  return h;
}

PrefixCache::PrefixCache(PagePool& pool, uint64_t config_key, int64_t max_bytes)
    : pool_(pool), key_(config_key), max_bytes_(max_bytes) {
  KVQ_CHECK(max_bytes > 0, "prefix cache: a budget of {} bytes", max_bytes);
  pool_.set_evictor([this] { return evict_one(); });
}

PrefixCache::~PrefixCache() {
  pool_.set_evictor(nullptr);
  clear();
}

namespace {
bool same(const std::vector<int32_t>& a, const int32_t* ids, int len) {
  return int(a.size()) == len && std::equal(a.begin(), a.end(), ids);
}
}  // namespace

bool PrefixCache::contains(const int32_t* ids, int len) const {
  auto [lo, hi] = entries_.equal_range(hash(key_, ids, len));
  for (auto it = lo; it != hi; ++it)
    if (same(it->second.ids, ids, len)) return true;
  return false;
}

int PrefixCache::longest(const int32_t* ids, int max_len, int step) const {
  if (step <= 0 || entries_.empty()) return 0;
  for (int len = max_len / step * step; len > 0; len -= step)
    if (contains(ids, len)) return len;
  return 0;
}

const PrefixCache::Entry* PrefixCache::find(const int32_t* ids, int len) {
  const uint64_t h = hash(key_, ids, len);
  auto [lo, hi] = entries_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (same(it->second.ids, ids, len)) {
      lru_.splice(lru_.end(), lru_, it->second.lru);  // most recently used
      return &it->second;
    }
  return nullptr;
}

void PrefixCache::insert(const int32_t* ids, int len, std::vector<int> pages, std::vector<uint8_t> state) {
  if (find(ids, len)) return;
  const int64_t bytes = int64_t(state.size()) + int64_t(len) * int64_t(sizeof(int32_t));
  if (bytes > max_bytes_) return;  // larger than the whole budget: not kept
  while (bytes_ + bytes > max_bytes_ && evict_one()) {
  }
  for (int p : pages) pool_.cache_ref(p, +1);
  const uint64_t h = hash(key_, ids, len);
  lru_.push_back(h);
  Entry e{std::vector<int32_t>(ids, ids + len), std::move(pages), std::move(state), std::prev(lru_.end())};
  entries_.emplace(h, std::move(e));
  bytes_ += bytes;
}

void PrefixCache::drop(std::unordered_multimap<uint64_t, Entry>::iterator it) {
  Entry& e = it->second;
  for (int p : e.pages) pool_.cache_ref(p, -1);
  bytes_ -= int64_t(e.state.size()) + int64_t(e.ids.size()) * int64_t(sizeof(int32_t));
  lru_.erase(e.lru);
  entries_.erase(it);
}

bool PrefixCache::evict_one() {
  if (lru_.empty()) return false;
  // The least recently used: the first hash of the list; among entries of that hash, the one whose lru is first.
  const auto first = lru_.begin();
  auto [lo, hi] = entries_.equal_range(*first);
  for (auto it = lo; it != hi; ++it)
    if (it->second.lru == first) {
      drop(it);
      ++evictions_;
      return true;
    }
  KVQ_FAIL("prefix cache: the LRU list names an entry that does not exist (internal)");
}

void PrefixCache::clear() {
  while (!entries_.empty()) drop(entries_.begin());
}

PrefixCacheStats PrefixCache::stats() const {
  return {.enabled = true, .entries = int64_t(entries_.size()), .state_bytes = bytes_,
          .pages = pool_.cached_pages(), .hit_tokens = hits_, .miss_tokens = misses_, .evictions = evictions_};
}

}  // namespace kvq
