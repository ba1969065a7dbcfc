#include "codecs/fp8/codec_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace kvq {

namespace {
constexpr int kMaxD = 256;
using tq::kTile;
}  // namespace

Fp8Codec::Fp8Codec(std::string name, fp8::Format format, bool scaled, int head_dim, SimdLevel level)
    : name_(std::move(name)), format_(format), scaled_(scaled), d_(head_dim), kernels_(tq::tile_kernels(level)) {
  KVQ_CHECK(head_dim > 0 && head_dim % 32 == 0 && head_dim <= kMaxD, "{}: head_dim {}", name_, head_dim);
  KVQ_CHECK(!scaled || format == fp8::Format::kE4m3, "{}: per-row scales are e4m3's", name_);
  for (int b = 0; b < 256; ++b)
    table_[b] = format == fp8::Format::kE4m3 ? fp8::e4m3_to_f32(uint8_t(b)) : fp8::e5m2_to_f32(uint8_t(b));
}

float Fp8Codec::scale(const uint8_t* row) const {
  if (!scaled_) return 1.f;
  float s;
  std::memcpy(&s, row + d_, sizeof s);
  return s;
}

void Fp8Codec::encode(const float* x, uint8_t* block) const {
  if (!scaled_) {
    for (int i = 0; i < d_; ++i)
      block[i] = format_ == fp8::Format::kE4m3 ? fp8::f32_to_e4m3(x[i]) : fp8::f32_to_e5m2(x[i]);
    return;
  }
  float absmax = 0.f;
  for (int i = 0; i < d_; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const float s = fp8::token_head_scale(absmax), inv = fp8::inverse_scale(s);
  for (int i = 0; i < d_; ++i) block[i] = fp8::f32_to_e4m3(x[i] * inv);
  std::memcpy(block + d_, &s, sizeof s);
}

void Fp8Codec::decode(const uint8_t* block, float* x) const {
  const float s = scale(block);
  for (int i = 0; i < d_; ++i) x[i] = scaled_ ? table_[block[i]] * s : table_[block[i]];
}

void Fp8Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  const size_t bpb = bytes_per_block();
  float xt[kMaxD * kTile], f[kTile];
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int n = std::min(kTile, n_tokens - t0);
    if (n < kTile) std::fill(xt, xt + d_ * kTile, 0.f), std::fill(f, f + kTile, 0.f);
    for (int t = 0; t < n; ++t) {
      const uint8_t* row = blocks + size_t(t0 + t) * bpb;
      for (int c = 0; c < d_; ++c) xt[c * kTile + t] = table_[row[c]];
      f[t] = scale(row);
    }
    kernels_.scores(q, n_q, xt, n, d_, f, s + t0, size_t(n_tokens));
  }
}

void Fp8Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  constexpr int kMaxQ = 64;  // queries per pass: their weights live on the stack
  const size_t bpb = bytes_per_block();
  float x[kTile * kMaxD], w[kMaxQ * kTile];
  for (int i0 = 0; i0 < n_q; i0 += kMaxQ) {
    const int nq = std::min(kMaxQ, n_q - i0);
    for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
      const int n = std::min(kTile, n_tokens - t0);
      for (int t = 0; t < n; ++t) {
        const uint8_t* row = blocks + size_t(t0 + t) * bpb;
        for (int c = 0; c < d_; ++c) x[t * d_ + c] = table_[row[c]];
        const float s = scale(row);
        for (int i = 0; i < nq; ++i) w[i * kTile + t] = p[size_t(i0 + i) * n_tokens + t0 + t] * s;
      }
      kernels_.accumulate(w, nq, x, n, d_, acc + size_t(i0) * d_);
    }
  }
}

}  // namespace kvq
