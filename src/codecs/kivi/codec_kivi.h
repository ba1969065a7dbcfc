// KIVI key codec (kivi2 / kivi4 with CodecSpec.per_channel): a block is G consecutive tokens of one kv
// head; each channel is quantized over those G tokens by kvq::quantize_group (bits, clip; KIVI itself is
// plain min/max, clip 1.0), fp16 scale and zero per channel. Layout: layout::KiviKeyBlock (layout.h),
// GroupParams[d] then G token-major rows of packed codes. Bits per element: b + 32/G.
// (KIVI values are per-token rows: IntCodec named "kivi2" / "kivi4".)
#pragma once

#include "codecs/codec.h"
#include "simd/simd.h"

namespace kvq {

class KiviKeyCodec final : public KvCodec {
 public:
  // bits in {2, 4}; g_tokens (G) in {32, 64, 128}; validated by make_codec.
  KiviKeyCodec(int head_dim, int g_tokens, int bits, float clip, SimdLevel level = best_simd_level());

  std::string_view name() const override { return bits_ == 2 ? "kivi2" : "kivi4"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return g_; }
  size_t bytes_per_block() const override;
  int bits() const { return bits_; }
  float clip() const { return clip_; }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Per block: q'_c = q_c·scale_c, then s = q'·code - Σ_c q'_c·zero_c, reading the packed codes directly.
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  // Per block: acc_c += scale_c·(Σ_t p_t·code_t,c) - scale_c·zero_c·Σ_t p_t.
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  int d_;       // channels per token
  int g_;       // G, tokens per block (the per-channel quantization group)
  int bits_;    // b in {2, 4}
  float clip_;  // quantile clip ratio r in (0, 1]
  RowKernels kernels_;
};

}  // namespace kvq
