// FP8 KV-cache codecs as vLLM ships them (formats and per-row maths: codecs/fp8/fp8.h): e4m3 and e5m2 rows with its
// default per-tensor scale of 1.0 (fp8e4m3 — vLLM's `fp8` and `fp8_e4m3`, TurboQuant k8v4's keys — and fp8e5m2), and
// e4m3 rows with an fp32 scale per (token, kv head) (fp8_per_token_head). Per-token codecs (one row per block) of keys
// and values alike. The e4m3 / e5m2 rows also take a calibrated per-tensor scale (CodecSpec::tensor_scale: the cache
// makes one codec per layer from --kv-scales, codecs/fp8/fp8_scales.h).
#pragma once

#include <string>

#include "codecs/codec.h"
#include "codecs/fp8/fp8.h"
#include "simd/simd.h"

namespace kvq {

class Fp8Codec final : public KvCodec {
 public:
  // head_dim a multiple of 32 up to 256 (validated by make_codec); scaled: a per-row scale (e4m3 only); tensor_scale:
  // the per-tensor scale s of unscaled rows (1: vLLM's default). level: which row kernels scores() and accumulate()
  // run (tests force each level).
  Fp8Codec(std::string name, fp8::Format format, bool scaled, int head_dim, SimdLevel level = best_simd_level(),
           float tensor_scale = 1.f);

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(fp8::row_bytes(d_, scaled_)); }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // The row kernels of the format (simd.h: each code widened through fp16, where it is exact), then the rows' scales:
  // once per score, or folded into the weights; a per-tensor scale is folded into the queries, or multiplies the
  // weighted sum once.
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;
  float tensor_scale() const { return tensor_scale_; }

 private:
  float scale(const uint8_t* row) const;  // the row's s (the per-tensor scale for unscaled rows)
  bool rescales() const { return scaled_ || tensor_scale_ != 1.f; }  // decoded values are codes · s

  std::string name_;
  fp8::Format format_;
  bool scaled_;
  float tensor_scale_;
  int d_;
  RowsView rows(const uint8_t* blocks, int n_tokens) const;

  RowKernels kernels_;
};

}  // namespace kvq
