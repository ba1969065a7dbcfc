#include "codecs/fp8/codec_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.h"

namespace kvq {

namespace {
constexpr int kMaxD = 256;
}  // namespace

Fp8Codec::Fp8Codec(std::string name, fp8::Format format, bool scaled, int head_dim, SimdLevel level,
                   float tensor_scale)
    : name_(std::move(name)), format_(format), scaled_(scaled), tensor_scale_(tensor_scale), d_(head_dim),
      kernels_(row_kernels(format == fp8::Format::kE4m3 ? RowFormat::kFp8E4m3 : RowFormat::kFp8E5m2, level)) {
  KVQ_CHECK(head_dim > 0 && head_dim % 32 == 0 && head_dim <= kMaxD, "{}: head_dim {}", name_, head_dim);
  KVQ_CHECK(!scaled || format == fp8::Format::kE4m3, "{}: per-row scales are e4m3's", name_);
  KVQ_CHECK(std::isfinite(tensor_scale) && tensor_scale > 0.f && (!scaled || tensor_scale == 1.f),
            "{}: per-tensor scale {} (finite, > 0, and 1 for rows with scales of their own)", name_, tensor_scale);
}

float Fp8Codec::scale(const uint8_t* row) const {
  if (!scaled_) return tensor_scale_;
  float s;
  std::memcpy(&s, row + d_, sizeof s);
  return s;
}

void Fp8Codec::encode(const float* x, uint8_t* block) const {
  if (!scaled_) {  // fp8(x / s): at vLLM's default s = 1 the division is exact, x itself
    const float s = tensor_scale_;
    for (int i = 0; i < d_; ++i)
      block[i] = format_ == fp8::Format::kE4m3 ? fp8::f32_to_e4m3(x[i] / s) : fp8::f32_to_e5m2(x[i] / s);
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
  for (int i = 0; i < d_; ++i) {
    const float v = format_ == fp8::Format::kE4m3 ? fp8::e4m3_to_f32(block[i]) : fp8::e5m2_to_f32(block[i]);
    x[i] = rescales() ? v * s : v;
  }
}

RowsView Fp8Codec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.d = d_;
  r.group = d_;
  r.n_rows = n_tokens;
  return r;
}

void Fp8Codec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  if (!scaled_ && tensor_scale_ != 1.f) {  // one scale for every row: folded into the queries, d products a query
    thread_local std::vector<float> qs;
    qs.assign(q, q + size_t(n_q) * d_);
    for (float& x : qs) x *= tensor_scale_;
    return kernels_.scores(rows(blocks, n_tokens), qs.data(), n_q, s, size_t(n_tokens));
  }
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
  if (!scaled_) return;
  for (int t = 0; t < n_tokens; ++t) {
    const float f = scale(blocks + size_t(t) * bytes_per_block());
    for (int i = 0; i < n_q; ++i) s[size_t(i) * n_tokens + t] *= f;
  }
}

void Fp8Codec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  if (!rescales()) return kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
  if (!scaled_) {  // one scale for every row: Σ_t p_t codes_t, then times s once, d products a query
    thread_local std::vector<float> sum;
    sum.assign(size_t(n_q) * d_, 0.f);
    kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, sum.data());
    for (size_t i = 0; i < sum.size(); ++i) acc[i] += tensor_scale_ * sum[i];
    return;
  }
  thread_local std::vector<float> w;  // p with each row's scale folded in
  w.resize(size_t(n_q) * n_tokens);
  for (int t = 0; t < n_tokens; ++t) {
    const float f = scale(blocks + size_t(t) * bytes_per_block());
    for (int i = 0; i < n_q; ++i) w[size_t(i) * n_tokens + t] = p[size_t(i) * n_tokens + t] * f;
  }
  kernels_.accumulate(rows(blocks, n_tokens), w.data(), size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
