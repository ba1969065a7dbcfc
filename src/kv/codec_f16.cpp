#include "kv/codec_f16.h"

#include <cstring>

#include "common/error.h"

namespace kvq {

F16Codec::F16Codec(int head_dim, SimdLevel level) : d_(head_dim), kernels_(row_kernels(RowFormat::kF16, level)) {
  KVQ_CHECK(d_ > 0 && d_ % 32 == 0 && d_ <= 256, "F16Codec: head_dim {}", d_);
}

void F16Codec::encode(const float* x, uint8_t* block) const {
  for (int c = 0; c < d_; ++c) {
    const fp16_t h = f32_to_fp16(x[c]);
    std::memcpy(block + 2 * c, &h, 2);
  }
}

void F16Codec::decode(const uint8_t* block, float* x) const {
  for (int c = 0; c < d_; ++c) {
    fp16_t h;
    std::memcpy(&h, block + 2 * c, 2);
    x[c] = fp16_to_f32(h);
  }
}

RowsView F16Codec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.d = d_;
  r.group = d_;
  r.n_rows = n_tokens;
  return r;
}

void F16Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "f16: scores over n_q={} n_tokens={}", n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
}

void F16Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "f16: accumulate over n_q={} n_tokens={}", n_q, n_tokens);
  kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
