#include "kv/codec_f32.h"

#include <cblas.h>

#include <cstring>

namespace kvq {

void F32Codec::encode(const float* x, uint8_t* block) const { std::memcpy(block, x, bytes_per_block()); }

void F32Codec::decode(const uint8_t* block, float* x) const { std::memcpy(x, block, bytes_per_block()); }

// s[n_q, n] = q[n_q, d] · K[n, d]^T and acc[n_q, d] += p[n_q, n] · V[n, d]: plain GEMMs on the stored rows.
void F32Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_q, n_tokens, d_, 1.f, q, d_,
              reinterpret_cast<const float*>(blocks), d_, 0.f, s, n_tokens);
}

void F32Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_q, d_, n_tokens, 1.f, p, n_tokens,
              reinterpret_cast<const float*>(blocks), d_, 1.f, acc, d_);
}

}  // namespace kvq
