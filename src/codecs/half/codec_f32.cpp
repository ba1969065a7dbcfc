#include "codecs/half/codec_f32.h"

#include <cstring>

namespace kvq {

void F32Codec::encode(const float* x, uint8_t* block) const { std::memcpy(block, x, bytes_per_block()); }

void F32Codec::decode(const uint8_t* block, float* x) const { std::memcpy(x, block, bytes_per_block()); }

// s[n_q, n] = q[n_q, d] · K[n, d]^T and acc[n_q, d] += p[n_q, n] · V[n, d], row by row with dot products
// accumulated in double: this is the lossless reference cache, not a fast path.
void F32Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  const float* k = reinterpret_cast<const float*>(blocks);
  for (int t = 0; t < n_tokens; ++t, k += d_)
    for (int i = 0; i < n_q; ++i) {
      const float* qi = q + size_t(i) * d_;
      double dot = 0.0;
      for (int c = 0; c < d_; ++c) dot += double(qi[c]) * k[c];
      s[size_t(i) * n_tokens + t] = float(dot);
    }
}

void F32Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  const float* v = reinterpret_cast<const float*>(blocks);
  for (int t = 0; t < n_tokens; ++t, v += d_)
    for (int i = 0; i < n_q; ++i) {
      const float w = p[size_t(i) * n_tokens + t];
      float* ai = acc + size_t(i) * d_;
      for (int c = 0; c < d_; ++c) ai[c] += w * v[c];
    }
}

}  // namespace kvq
