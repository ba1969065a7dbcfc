#include "tokenizer/bpe.h"

#include <bit>
#include <limits>
#include <mutex>
#include <queue>

#include "common/error.h"

namespace kvq {

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> token_ids,
                   std::unordered_map<uint64_t, Merge> merges, bool ignore_merges)
    : token_ids_(std::move(token_ids)), ignore_merges_(ignore_merges) {
  size_t n_slots = 2;
  while (n_slots < 2 * merges.size()) n_slots *= 2;
  merge_slots_.assign(n_slots, Slot{});
  cache_.reserve(kCacheMaxEntries);
  merge_shift_ = 64 - std::countr_zero(n_slots);
  for (const auto& [key, m] : merges) {
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    while (merge_slots_[i].key != kEmpty) i = (i + 1) & (n_slots - 1);
    merge_slots_[i] = {key, m};
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_ids_.find(std::string(1, static_cast<char>(b)));
    KVQ_CHECK(it != token_ids_.end(), "byte-level BPE vocab lacks the token for byte 0x{:02x}", b);
    byte_ids_[b] = it->second;
  }
}

size_t BpeModel::cache_size() const {
  std::shared_lock lock(cache_mutex_);
  return cache_.size();
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  encode_uncached(piece, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void BpeModel::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = token_ids_.find(std::string(piece));
    if (it != token_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const int n = static_cast<int>(piece.size());
  if (n > kSmallPiece) {
    encode_heap(piece, out);
    return;
  }
  // Small pieces: ids[0..len) and rank[i] of the pair (ids[i], ids[i+1]); merge the lowest, leftmost first.
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  int32_t ids[kSmallPiece], rank[kSmallPiece], merged[kSmallPiece];
  auto set_pair = [&](int i) {
    const Merge* m = find_merge(ids[i], ids[i + 1]);
    rank[i] = m ? m->rank : kNone;
    merged[i] = m ? m->new_id : -1;
  };
  for (int i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  for (int i = 0; i + 1 < n; ++i) set_pair(i);
  int len = n;
  for (;;) {
    int best = -1;
    int32_t best_rank = kNone;
    for (int i = 0; i + 1 < len; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best < 0) break;
    ids[best] = merged[best];
    for (int i = best + 1; i + 1 < len; ++i) ids[i] = ids[i + 1];  // drop ids[best + 1] ...
    for (int i = best + 1; i + 2 < len; ++i) {                        // ... and the pair it started
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --len;
    if (best > 0) set_pair(best - 1);
    if (best + 1 < len) set_pair(best);
  }
  out.insert(out.end(), ids, ids + len);
}

void BpeModel::encode_heap(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const int n = static_cast<int>(piece.size());
  // Symbols form a doubly linked list over positions 0..n-1; a merged-away symbol has id -1.
  struct Sym {
    int32_t id;
    int prev, next;  // -1 at the ends
  };
  std::vector<Sym> sym(n);
  for (int i = 0; i < n; ++i) sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};

  struct Cand {
    int32_t rank;
    int pos;  // left symbol's position
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push_pair = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    if (const Merge* m = find_merge(sym[left].id, sym[sym[left].next].id)) heap.push({m->rank, left});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = sym[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    const Merge* m = find_merge(left.id, sym[left.next].id);
    if (m == nullptr || m->rank != c.rank) continue;  // stale: a neighbour changed since it was pushed
    const int right = left.next;
    left.id = m->new_id;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    sym[right].id = -1;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::vector<int32_t> BpeModel::encode_ref(std::string_view piece) const {
  std::vector<int32_t> ids;
  if (ignore_merges_) {
    auto it = token_ids_.find(std::string(piece));
    if (it != token_ids_.end()) return {it->second};
  }
  for (char c : piece) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  for (;;) {
    int best = -1;
    const Merge* best_m = nullptr;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const Merge* m = find_merge(ids[i], ids[i + 1]);
      if (m != nullptr && (best_m == nullptr || m->rank < best_m->rank)) {
        best = static_cast<int>(i);
        best_m = m;
      }
    }
    if (best_m == nullptr) return ids;
    ids[best] = best_m->new_id;
    ids.erase(ids.begin() + best + 1);
  }
}

}  // namespace kvq
