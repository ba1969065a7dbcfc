#include "codecs/half/codec_bf16.h"

#include <cstring>

#include "common/error.h"

namespace kvq {

Half16Codec::Half16Codec(RowFormat format, int head_dim, SimdLevel level)
    : f16_(format == RowFormat::kF16), d_(head_dim), kernels_(row_kernels(format, level)) {
  KVQ_CHECK(format == RowFormat::kBf16 || format == RowFormat::kF16, "Half16Codec: row format {} is not 16-bit",
            int(format));
  KVQ_CHECK(d_ > 0 && d_ % 32 == 0 && d_ <= 256, "{}: head_dim {}", name(), d_);
}

void Half16Codec::encode(const float* x, uint8_t* block) const {
  for (int c = 0; c < d_; ++c) {
    const uint16_t h = f16_ ? f32_to_fp16(x[c]) : f32_to_bf16(x[c]);
    std::memcpy(block + 2 * c, &h, 2);
  }
}

void Half16Codec::decode(const uint8_t* block, float* x) const {
  for (int c = 0; c < d_; ++c) {
    uint16_t h;
    std::memcpy(&h, block + 2 * c, 2);
    x[c] = f16_ ? fp16_to_f32(h) : bf16_to_f32(h);
  }
}

RowsView Half16Codec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.d = d_;
  r.group = d_;
  r.n_rows = n_tokens;
  return r;
}

void Half16Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name(), n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
}

void Half16Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name(), n_q, n_tokens);
  kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
