// Byte-level BPE model (Hugging Face `tokenizers` models.BPE, no dropout, no byte fallback): turns one
// pre-token (raw bytes) into token ids by repeatedly merging the adjacent pair of lowest merge rank, the
// leftmost pair first among equal ranks — exactly HF's BPE::merge_word without dropout.
//
// Everything here works on raw bytes: vocab strings of the byte-level alphabet ("Ġthe") are mapped back to
// their bytes (" the") at load time, so no per-call byte -> unicode mapping is needed.
#pragma once

#include <array>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvq {

class BpeModel {
 public:
  struct Merge {
    int32_t rank;    // position in the merges list (lower merges first)
    int32_t new_id;  // id of the merged token
  };

  // token_ids: raw-byte token -> id for every vocab token written in the byte-level alphabet; it must
  // contain all 256 single-byte tokens. merges: (left id, right id) -> Merge. ignore_merges: a pre-token
  // that is itself a vocab token is emitted as that token without merging (Llama 3).
  BpeModel(std::unordered_map<std::string, int32_t> token_ids,
           std::unordered_map<uint64_t, Merge> merges, bool ignore_merges);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // Appends the ids of one pre-token (raw bytes, non-empty) to out. Thread-safe; results are cached.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  // Fast path without the cache: pieces up to kSmallPiece bytes rescan a rank array held on the stack;
  // longer ones use a min-heap of candidate pairs over a linked list of symbols, O(n log n).
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_heap(std::string_view piece, std::vector<int32_t>& out) const;  // the heap path, any length
  // Scalar reference twin: rescan every adjacent pair for the lowest rank after each merge, O(n^2).
  std::vector<int32_t> encode_ref(std::string_view piece) const;

  size_t cache_size() const;

  static constexpr size_t kCacheMaxEntries = 1 << 16;  // cleared when full
  static constexpr size_t kCacheMaxPieceBytes = 256;   // longer pre-tokens are not cached
  static constexpr int kSmallPiece = 48;                // pieces up to this many bytes take the array path

 private:
  // Open-addressing hash table of the merges (linear probing, power-of-two size, load <= 1/2).
  struct Slot {
    uint64_t key = kEmpty;  // pair_key(left, right), kEmpty when unused
    Merge merge{};
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  const Merge* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;; i = (i + 1) & (merge_slots_.size() - 1)) {
      const Slot& s = merge_slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }

  std::unordered_map<std::string, int32_t> token_ids_;  // raw-byte token -> id (byte-level vocab entries)
  std::vector<Slot> merge_slots_;                        // pair_key(left, right) -> rank and merged id
  int merge_shift_ = 63;                                   // 64 - log2(merge_slots_.size())
  std::array<int32_t, 256> byte_ids_{};                   // (256,) id of each single-byte token
  bool ignore_merges_ = false;                            // emit whole-vocab pre-tokens directly

  struct PieceHash {  // lets the cache be probed with a string_view, without building a std::string
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::shared_mutex cache_mutex_;  // guards cache_
  mutable std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> cache_;  // bytes -> ids
};

}  // namespace kvq
