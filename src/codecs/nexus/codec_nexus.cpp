#include "codecs/nexus/codec_nexus.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "codecs/float_dot.h"
#include "codecs/layout.h"
#include "common/error.h"
#include "rotation/hadamard.h"

namespace kvq {

namespace {

constexpr int kMaxDim = 256;
constexpr float kMinAmax = 1e-8f;      // NexusQuant's clamp of max|y| (a zero row stores scale 0: decodes to 0)
constexpr float kFp16Max = 65504.f;
constexpr float kE8_2Top = 1.5f;       // e8_2's top level, in units of d

float stored_scale(const uint8_t* block) {
  fp16_t h;
  std::memcpy(&h, block, sizeof h);
  return fp16_to_f32(h);
}

}  // namespace

NexusCodec::NexusCodec(std::string name, int head_dim, NexusFormat format, E8Rule rule, SimdLevel level)
    : name_(std::move(name)), d_(head_dim), format_(format), rule_(rule),
      kernels_(row_kernels(RowFormat::kInt2, level)) {
  KVQ_CHECK(is_power_of_two(d_) && d_ >= 32 && d_ <= kMaxDim, "{}: head_dim {} (supported: 32, 64, 128, 256)", name_,
            d_);
}

void NexusCodec::encode(const float* x, uint8_t* block) const {
  float y[kMaxDim], p[kMaxDim];
  std::copy_n(x, d_, y);
  fwht_rows(y, 1, d_);
  float amax = 0.f;
  for (int c = 0; c < d_; ++c) amax = std::max(amax, std::fabs(y[c]));
  KVQ_CHECK(std::isfinite(amax) && std::isfinite(y[0]), "{}: a row with a non-finite value (max |x·H| = {})", name_,
            amax);
  const float s = std::max(amax, kMinAmax) / float(kNexusLevels / 2);
  for (int c = 0; c < d_; ++c) y[c] /= s;  // u, in [-L/2, L/2]
  for (int g = 0; g < d_; g += kE8Dim) {
    if (format_ == NexusFormat::kInt8)
      e8_nearest(y + g, kNexusLevels / 2, rule_, p + g);
    else
      half_coset_nearest(y + g, kE8_2Top, rule_ == E8Rule::kStrict, p + g);
  }
  const fp16_t scale = f32_to_fp16(std::min(s, kFp16Max));
  std::memcpy(block, &scale, sizeof scale);
  uint8_t* codes = block + kNexusCodesOffset;
  if (format_ == NexusFormat::kInt8) {
    for (int c = 0; c < d_; ++c) codes[c] = uint8_t(int8_t(2.f * p[c]));  // exact: 2p is an integer in [-4, 4]
  } else {
    uint8_t c2[kMaxDim];
    for (int c = 0; c < d_; ++c) c2[c] = uint8_t(p[c] + kE8_2Top);  // exact: p + 1.5 in {0, 1, 2, 3}
    layout::pack_codes(c2, d_, 2, codes);
  }
}

float NexusCodec::points(const uint8_t* block, float* p) const {
  const uint8_t* codes = block + kNexusCodesOffset;
  if (format_ == NexusFormat::kInt8) {
    for (int c = 0; c < d_; c += 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) p[c + j] = 0.5f * float(int8_t(codes[c + j]));
    }
  } else {  // codecs/layout.h units: byte j of a unit's 8 holds values j, j + 8, j + 16, j + 24 (bits 0-1, ..., 6-7)
    for (int u = 0; u < d_ / layout::kUnitValues; ++u) {
      const uint8_t* b = codes + u * layout::unit_bytes(2);
      float* pu = p + u * layout::kUnitValues;
      for (int k = 0; k < 4; ++k) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) pu[8 * k + j] = float((b[j] >> (2 * k)) & 3) - kE8_2Top;
      }
    }
  }
  return stored_scale(block);
}

void NexusCodec::decode(const uint8_t* block, float* x) const {
  const float s = points(block, x);
  for (int c = 0; c < d_; ++c) x[c] *= s;  // ŷ
  fwht_rows(x, 1, d_);                     // x̂ = ŷ · H
}

void NexusCodec::decode_rows(const uint8_t* blocks, int n_blocks, float* x) const {
  constexpr int kRows = 8;
  alignas(32) float y[kMaxDim][kRows];  // 8 rows' values side by side: y[c][r]
  float p[kMaxDim];
  const float norm = 1.f / std::sqrt(float(d_));  // rotation/hadamard.cpp's fwht_rows
  for (int t0 = 0; t0 < n_blocks; t0 += kRows) {
    const int n = std::min(kRows, n_blocks - t0);
    for (int r = 0; r < kRows; ++r) {
      const float s = r < n ? points(blocks + size_t(t0 + r) * bytes_per_block(), p) : 0.f;
      for (int c = 0; c < d_; ++c) y[c][r] = r < n ? p[c] * s : 0.f;  // ŷ, as decode
    }
    for (int h = 1; h < d_; h *= 2)  // hadamard.cpp's butterflies, a row per lane
      for (int i = 0; i < d_; i += 2 * h)
        for (int j = i; j < i + h; ++j)
#pragma GCC unroll 8
          for (int r = 0; r < kRows; ++r) {
            const float a = y[j][r], b = y[j + h][r];
            y[j][r] = a + b;
            y[j + h][r] = a - b;
          }
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < d_; ++c) x[size_t(t0 + r) * d_ + c] = y[c][r] * norm;
  }
}

RowsView NexusCodec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.codes_offset = kNexusCodesOffset;
  r.d = d_;
  r.group = d_;
  r.grouped = false;  // plain codes c: the kernels compute Σ q'·c and Σ w·c
  r.n_rows = n_tokens;
  return r;
}

float NexusCodec::scale(const uint8_t* blocks, int t) const {
  return stored_scale(blocks + size_t(t) * bytes_per_block());
}

void NexusCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  thread_local std::vector<float> qh;  // q · H, once per call: ⟨q, ŷ H⟩ = ⟨q H, ŷ⟩
  qh.assign(q, q + size_t(n_q) * d_);
  fwht_rows(qh.data(), n_q, d_);
  if (format_ == NexusFormat::kE8_2) {  // s_t · (Σ q'·c - 1.5 Σ q')
    kernels_.scores(rows(blocks, n_tokens), qh.data(), n_q, s, size_t(n_tokens));
    for (int i = 0; i < n_q; ++i) {
      float qsum = 0.f;
      for (int c = 0; c < d_; ++c) qsum += qh[size_t(i) * d_ + c];
      float* si = s + size_t(i) * n_tokens;
      for (int t = 0; t < n_tokens; ++t) si[t] = scale(blocks, t) * (si[t] - kE8_2Top * qsum);
    }
    return;
  }
  float p[kMaxDim];
  for (int t = 0; t < n_tokens; ++t) {
    const float sc = points(blocks + size_t(t) * bytes_per_block(), p);
    for (int i = 0; i < n_q; ++i) s[size_t(i) * n_tokens + t] = sc * dot8(qh.data() + size_t(i) * d_, p, d_);
  }
}

void NexusCodec::accumulate(const float* w, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  thread_local std::vector<float> yh, ws;  // Σ_t w_t ŷ_t in the Hadamard domain, rotated back once per call
  yh.assign(size_t(n_q) * d_, 0.f);
  if (format_ == NexusFormat::kE8_2) {  // Σ_t w_t s_t (c_t - 1.5): the kernels' Σ (w s)·c, then the 1.5 term
    ws.resize(size_t(n_q) * n_tokens);
    for (int i = 0; i < n_q; ++i) {
      float wsum = 0.f;
      for (int t = 0; t < n_tokens; ++t) {
        const size_t k = size_t(i) * n_tokens + t;
        ws[k] = w[k] * scale(blocks, t);
        wsum += ws[k];
      }
      for (int c = 0; c < d_; ++c) yh[size_t(i) * d_ + c] = -kE8_2Top * wsum;
    }
    kernels_.accumulate(rows(blocks, n_tokens), ws.data(), size_t(n_tokens), n_q, yh.data());
  } else {
    float p[kMaxDim];
    for (int t = 0; t < n_tokens; ++t) {
      const float sc = points(blocks + size_t(t) * bytes_per_block(), p);
      for (int i = 0; i < n_q; ++i) {
        const float wt = w[size_t(i) * n_tokens + t] * sc;
        if (wt != 0.f) axpy8(wt, p, yh.data() + size_t(i) * d_, d_);  // rows outside a query's view weigh 0
      }
    }
  }
  fwht_rows(yh.data(), n_q, d_);
  for (size_t k = 0; k < yh.size(); ++k) acc[k] += yh[k];
}

}  // namespace kvq
