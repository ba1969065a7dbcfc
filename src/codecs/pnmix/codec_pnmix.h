// PN-Mix keys (docs/guide/methods.md §5.7, kvq's definition; codec "pnmix"): mixed precision per RoPE channel pair.
//
// RoPE pair i of a split-half ("rotate half") head is the channels (i, i + d/2). Calibration (calib/pnmix.h) gives
// every pair of every (layer, kv head) a width b_i in 1..4 bits such that Σ_i 2 b_i = B·d for the average budget B
// (default 2); the widths are the PairBitTable, read from a calibration file (codecs/pnmix/pnmix_file.h).
// Width group w of a head: the channels of its pairs of width w, in ascending channel order (2 n_w channels).
// A row (one token of one kv head) quantizes each non-empty width group with the §1 grid at w bits
// (codecs/group_quant.h, the key clip), fp16 scale and zero per (token, width group).
//
// Block (one token), layout::PnmixRow (codecs/pnmix/pnmix_format.h, with the table the GPU decodes a head with):
//   GroupParams params[n_slots]     slot j: the j-th width present in this head, widths ascending; a head with
//                                   fewer widths present leaves its last slots zero (stored, counted)
//   uint8_t     codes[ceil(B·d/8)]  every width group's codes, widths ascending, channels ascending, as one
//                                   little-endian bit stream: a code of w bits starts where the previous ended,
//                                   least significant bit first
// n_slots = the most widths any one (layer, kv head) of the table uses (PairBitTable::slots), and B·d bits are
// the same for every head, so every head of a cache stores the same bytes: one page layout (choice; the
// alternative, bytes per head, would need per-head page regions). At d = 128, B = 2, four widths present:
// 16 + 32 = 48 B, 3.0 bits per element; the group overheads are the price of mixing widths.
// The map (the width of every pair) is per-(layer, kv head) metadata stored once, with the codec (d/2 bytes, one
// uint8 per pair), not per token (choice): metadata_bytes(), which the cache's footprint counts once per head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/layout.h"
#include "codecs/pnmix/pnmix_format.h"

namespace kvq {

// The calibrated widths of one model: every RoPE pair of every (layer, kv head).
struct PairBitTable {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<uint8_t> bits;  // [n_layers][n_kv_heads][head_dim / 2] width of pair i (channels i, i + d/2), 1..4
  std::string name = "pnmix";  // what produced it, e.g. "pnmix(product)" (for CacheConfig::describe and reports)

  int pairs() const { return head_dim / 2; }
  const uint8_t* head(int layer, int kv_head) const { return bits.data() + (size_t(layer) * n_kv_heads + kv_head) * pairs(); }
  // Code bits of one row, Σ_i 2 b_i (the same for every head: validate()); B = code_bits / d.
  int code_bits() const;
  double key_bits() const { return double(code_bits()) / head_dim; }
  // The most widths present in one head: the width slots of every row.
  int slots() const;
  // Sizes, every width in [1, 4] and one code-bit total for every head; kvq::Error naming the first bad head.
  void validate() const;
};

class PnmixKeyCodec final : public KvCodec {
 public:
  // pair_bits: this head's d/2 widths (valid, as PairBitTable::validate checks); n_slots >= the widths it uses.
  PnmixKeyCodec(const uint8_t* pair_bits, int head_dim, int n_slots, float clip);

  std::string_view name() const override { return "pnmix"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(layout::pnmix_row_bytes(code_bits_, n_slots_)); }
  size_t metadata_bytes() const override { return pair_bits_.size(); }  // the map, stored once per head
  // This head's layout::PnmixHeadTable (the GPU's CacheGeometry::k_table), from the widths and the clip.
  std::vector<uint8_t> device_table() const override;

  // Scalar: gather each width group, quantize_group, pack the bit stream (and its inverse).
  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Scores without decoding to x̂ (keys only: no accumulate): the queries gathered in stream order once a call, then
  // per row q · (code · scale) over the stream in eight sums, less Σ_groups scale · zero · Σ q. The same values as
  // scores_ref but for the float rounding and summation order (tested against it).
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;

  const std::vector<uint8_t>& pair_bits() const { return pair_bits_; }
  int code_bits() const { return code_bits_; }

 private:
  struct WidthGroup {
    int bits;                   // w
    std::vector<int> channels;  // ascending
  };
  int d_, n_slots_, code_bits_;
  float clip_;
  std::vector<uint8_t> pair_bits_;   // [d / 2]
  std::vector<WidthGroup> groups_;  // the widths present, ascending: slot j = groups_[j]
};

// The codec table's factory for pnmix keys: the head (spec.layer, spec.kv_head) of spec.pair_bits; kvq::Error when
// the table is absent (-ctk pnmix needs --pnmix FILE), does not fit the head_dim or has no such head, or the clip is
// out of (0, 1].
std::unique_ptr<KvCodec> make_pnmix_key_codec(const CodecSpec& spec);

}  // namespace kvq
