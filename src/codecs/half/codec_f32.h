// f32 codec: rows stored as raw float32 — the lossless reference cache ("pre-codec" results, golden tests).
#pragma once

#include "codecs/codec.h"

namespace kvq {

class F32Codec final : public KvCodec {
 public:
  explicit F32Codec(int head_dim) : d_(head_dim) {}

  std::string_view name() const override { return "f32"; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(d_) * sizeof(float); }  // block = float[d]

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  int d_;
};

}  // namespace kvq
