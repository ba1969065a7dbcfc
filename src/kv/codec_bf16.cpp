#include "kv/codec_bf16.h"

#include <cstring>

#include "common/error.h"

namespace kvq {

Bf16Codec::Bf16Codec(int head_dim, SimdLevel level) : d_(head_dim), kernels_(row_kernels(RowFormat::kBf16, level)) {
  KVQ_CHECK(d_ > 0 && d_ % 32 == 0 && d_ <= 256, "Bf16Codec: head_dim {}", d_);
}

void Bf16Codec::encode(const float* x, uint8_t* block) const {
  for (int c = 0; c < d_; ++c) {
    const bf16_t b = f32_to_bf16(x[c]);
    std::memcpy(block + 2 * c, &b, 2);
  }
}

void Bf16Codec::decode(const uint8_t* block, float* x) const {
  for (int c = 0; c < d_; ++c) {
    bf16_t b;
    std::memcpy(&b, block + 2 * c, 2);
    x[c] = bf16_to_f32(b);
  }
}

RowsView Bf16Codec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.d = d_;
  r.group = d_;
  r.n_rows = n_tokens;
  return r;
}

void Bf16Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "bf16: scores over n_q={} n_tokens={}", n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
}

void Bf16Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "bf16: accumulate over n_q={} n_tokens={}", n_q, n_tokens);
  kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
