// f16 codec: rows stored as raw IEEE binary16, rounded to nearest even with overflow to ±inf (common/half.h; the
// bits of llama.cpp's f16 cache, its default -ctk / -ctv). No scales. 16 bits per element.
#pragma once

#include "common/half.h"
#include "kv/codec.h"
#include "kv/simd.h"

namespace kvq {

class F16Codec final : public KvCodec {
 public:
  // level: which row kernels scores()/accumulate() run (tests force each level).
  explicit F16Codec(int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override { return "f16"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(d_) * sizeof(fp16_t); }  // block = fp16_t[d]

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;

  int d_;  // values per row
  RowKernels kernels_;
};

}  // namespace kvq
