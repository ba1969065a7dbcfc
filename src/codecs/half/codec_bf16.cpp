#include "codecs/half/codec_bf16.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace kvq {

Half16Codec::Half16Codec(RowFormat format, int head_dim, SimdLevel level)
    : f16_(format == RowFormat::kF16), d_(head_dim), body_(head_dim / 32 * 32), kernels_(row_kernels(format, level)) {
  KVQ_CHECK(format == RowFormat::kBf16 || format == RowFormat::kF16, "Half16Codec: row format {} is not 16-bit",
            int(format));
  KVQ_CHECK(d_ > 0 && d_ % 16 == 0 && d_ <= 256, "{}: head_dim {} (a multiple of 16 up to 256)", name(), d_);
}

float Half16Codec::value(const uint8_t* block, int c) const {
  uint16_t h;
  std::memcpy(&h, block + 2 * c, 2);
  return f16_ ? fp16_to_f32(h) : bf16_to_f32(h);
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
  r.d = body_;
  r.group = body_;
  r.n_rows = n_tokens;
  return r;
}

void Half16Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name(), n_q, n_tokens);
  if (body_ == d_) return kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
  // head_dim 32 k + 16: the body's queries compacted to body_ columns for the row kernels, then the tail's products.
  thread_local std::vector<float> qb;
  if (body_ > 0) {
    qb.resize(size_t(n_q) * body_);
    for (int i = 0; i < n_q; ++i) std::copy_n(q + size_t(i) * d_, body_, qb.data() + size_t(i) * body_);
    kernels_.scores(rows(blocks, n_tokens), qb.data(), n_q, s, size_t(n_tokens));
  }
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* row = blocks + size_t(t) * bytes_per_block();
    for (int i = 0; i < n_q; ++i) {
      float dot = body_ > 0 ? s[size_t(i) * n_tokens + t] : 0.f;
      for (int c = body_; c < d_; ++c) dot += q[size_t(i) * d_ + c] * value(row, c);
      s[size_t(i) * n_tokens + t] = dot;
    }
  }
}

void Half16Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name(), n_q, n_tokens);
  if (body_ == d_) return kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
  // head_dim 32 k + 16: the body's columns of acc compacted for the row kernels and put back, then the tail's sums.
  thread_local std::vector<float> ab;
  if (body_ > 0) {
    ab.resize(size_t(n_q) * body_);
    for (int i = 0; i < n_q; ++i) std::copy_n(acc + size_t(i) * d_, body_, ab.data() + size_t(i) * body_);
    kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, ab.data());
    for (int i = 0; i < n_q; ++i) std::copy_n(ab.data() + size_t(i) * body_, body_, acc + size_t(i) * d_);
  }
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* row = blocks + size_t(t) * bytes_per_block();
    for (int i = 0; i < n_q; ++i) {
      const float w = p[size_t(i) * n_tokens + t];
      for (int c = body_; c < d_; ++c) acc[size_t(i) * d_ + c] += w * value(row, c);
    }
  }
}

}  // namespace kvq
