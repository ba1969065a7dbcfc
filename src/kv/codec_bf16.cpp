#include "kv/codec_bf16.h"

#include <cstring>

namespace kvq {

void Bf16Codec::encode(const float* x, uint8_t* block) const {
  bf16_t* out = reinterpret_cast<bf16_t*>(block);
  for (int c = 0; c < d_; ++c) out[c] = f32_to_bf16(x[c]);
}

void Bf16Codec::decode(const uint8_t* block, float* x) const {
  const bf16_t* in = reinterpret_cast<const bf16_t*>(block);
  for (int c = 0; c < d_; ++c) x[c] = bf16_to_f32(in[c]);
}

void Bf16Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  const bf16_t* k = reinterpret_cast<const bf16_t*>(blocks);
  for (int t = 0; t < n_tokens; ++t, k += d_) {
    float row[256];
    for (int c = 0; c < d_; ++c) row[c] = bf16_to_f32(k[c]);
    for (int i = 0; i < n_q; ++i) {
      const float* qi = q + size_t(i) * d_;
      float dot = 0.f;
      for (int c = 0; c < d_; ++c) dot += qi[c] * row[c];
      s[size_t(i) * n_tokens + t] = dot;
    }
  }
}

void Bf16Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  const bf16_t* v = reinterpret_cast<const bf16_t*>(blocks);
  for (int t = 0; t < n_tokens; ++t, v += d_) {
    float row[256];
    for (int c = 0; c < d_; ++c) row[c] = bf16_to_f32(v[c]);
    for (int i = 0; i < n_q; ++i) {
      const float w = p[size_t(i) * n_tokens + t];
      float* ai = acc + size_t(i) * d_;
      for (int c = 0; c < d_; ++c) ai[c] += w * row[c];
    }
  }
}

}  // namespace kvq
