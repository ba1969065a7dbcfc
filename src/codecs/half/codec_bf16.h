// 16-bit row codecs, no scales, 16 bits per element: bf16 (raw bfloat16, layout::Bf16Row) and f16 (raw IEEE
// binary16, rounded to nearest even with overflow to ±inf, common/half.h: the bits of llama.cpp's f16 cache, its
// default -ctk / -ctv). One class: the two differ only in the rounding of a value and in their row kernels.
// head_dim is a multiple of 16 up to 256: the row kernels read units of 32 values, so a head_dim of 32 k + 16 (80:
// StableLM, Phi-2) reads its first 32 k values through them and its last 16 through a scalar tail (tail_ref).
#pragma once

#include "codecs/codec.h"
#include "common/half.h"
#include "simd/simd.h"

namespace kvq {

class Half16Codec final : public KvCodec {
 public:
  // format: RowFormat::kBf16 or RowFormat::kF16. level: which row kernels scores()/accumulate() run (tests force
  // each level).
  Half16Codec(RowFormat format, int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override { return f16_ ? "f16" : "bf16"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(d_) * 2; }  // block = d 16-bit values

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;  // the body: values [0, body_) of each row
  float value(const uint8_t* block, int c) const;            // value c of a row, widened

  bool f16_;  // IEEE binary16, else bfloat16
  int d_;     // values per row
  int body_;  // values read by the row kernels: d_ rounded down to a multiple of 32; [body_, d_) is the scalar tail
  RowKernels kernels_;
};

}  // namespace kvq
