// Per-token INT-b codecs (int8 / int4 / int2, and the per-token value side of kivi2 / kivi4): each row of
// one (token, kv head) is split into groups of G consecutive values, each group quantized by
// kvq::quantize_group (bits, clip) with fp16 scale and zero. Block = one token, laid out as
// layout::IntRow (layout.h): GroupParams[d/G] then the d codes packed in 32-value units.
// Bits per element: b + 32/G (int2 G=128: 2.25).
#pragma once

#include <string>

#include "codecs/codec.h"
#include "simd/simd.h"

namespace kvq {

class IntCodec final : public KvCodec {
 public:
  // name: "int2" | "int4" | "int8" | "kivi2" | "kivi4" (reported by name()); arguments are validated by
  // make_codec. level: which row kernels scores()/accumulate() run (tests force each level).
  IntCodec(std::string name, int head_dim, int group, int bits, float clip, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override;
  int group() const { return group_; }
  int bits() const { return bits_; }
  float clip() const { return clip_; }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;

  std::string name_;
  int d_;         // values per row
  int group_;     // G, values per scale/zero group
  int bits_;      // b in {2, 4, 8}
  float clip_;    // quantile clip ratio r in (0, 1]
  RowKernels kernels_;
};

}  // namespace kvq
