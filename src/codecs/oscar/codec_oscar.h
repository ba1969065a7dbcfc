// OScaR codecs (oscar_int2, docs/guide/methods.md §5.4; format, quantizer and ν: codecs/oscar/oscar_format.h):
//   keys   (CodecSpec.per_channel) blocks of 32 tokens, each channel one group over them: layout::OscarKeyBlock
//   values per-token rows, groups of 32 consecutive channels: layout::OscarValueRow
// 2-bit codes with fp16 (scale, -z·scale) per group: 3 bits per element on both sides at any head_dim. What the
// codecs store is what they are given: the cache divides keys by ν_t before encode() and multiplies the scores by
// it (CodecSpec.token_scale, kv/cache.h), and the Hadamard rotation is the cache's transform (the codec table's
// transform column).
#pragma once

#include "codecs/codec.h"
#include "simd/simd.h"

namespace kvq {

class OscarKeyCodec final : public KvCodec {
 public:
  explicit OscarKeyCodec(int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override { return "oscar_int2"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override;  // 32
  size_t bytes_per_block() const override;

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Per block: q'_c = q_c·scale_c, then s = q'·code + Σ_c q_c·zero_dequant_c, reading the packed codes directly.
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  // Per block: acc_c += scale_c·(Σ_t p_t·code_t,c) + zero_dequant_c·Σ_t p_t.
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  int d_;  // channels per token
  RowKernels kernels_;
};

class OscarValueCodec final : public KvCodec {
 public:
  explicit OscarValueCodec(int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override { return "oscar_int2"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override;

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Per group g of 32 channels: acc_g += Σ_t (p_t·scale_t,g)·code_t,g + Σ_t p_t·zero_dequant_t,g. (scores() of value
  // rows, which attention never calls, is the scalar reference.)
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  int d_;  // values per row
  RowKernels kernels_;
};

}  // namespace kvq
