#include "codecs/kitty/codec_kitty.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "common/error.h"

namespace kvq {

namespace {

constexpr int kT = layout::kKittyBlockTokens;

layout::MinScale params_at(const uint8_t* p, int i) {
  layout::MinScale m;
  std::memcpy(&m, p + 4 * size_t(i), 4);
  return m;
}

// Plane rows (one channel's 128 codes each, layout.h int2 packing) as the row kernels read them: n rows of 128
// values.
RowsView plane_rows(const uint8_t* plane, int n) {
  RowsView r;
  r.rows = plane;
  r.row_stride = size_t(layout::kKittyPlaneBytes);
  r.d = kT;
  r.group = kT;
  r.n_rows = n;
  return r;
}

}  // namespace

void kitty_channel_map(const float* x, int d, int n_boost, uint8_t* slot) {
  std::vector<double> score(size_t(d), 0.0);
  for (int t = 0; t < kT; ++t)
    for (int c = 0; c < d; ++c) score[size_t(c)] += std::fabs(double(x[size_t(t) * d + c]));
  for (double& s : score) s = std::isnan(s) ? -INFINITY : s / kT;  // a NaN channel is never boosted
  std::vector<int> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  std::fill(slot, slot + d, uint8_t(n_boost));
  for (int r = 0; r < n_boost; ++r) slot[order[size_t(r)]] = uint8_t(r);
}

// --- Keys.

KittyKeyCodec::KittyKeyCodec(std::string name, int head_dim, int boost_percent, SimdLevel level)
    : name_(std::move(name)),
      d_(head_dim),
      n_boost_(kitty_boosted_channels(head_dim, boost_percent)),
      kernels_(row_kernels(RowFormat::kInt2, level)) {
  KVQ_CHECK(d_ > 0 && d_ % 32 == 0 && d_ <= 256 && (boost_percent == 25 || boost_percent == 20),
            "KittyKeyCodec: head_dim {} boost {}% (supported: head_dim a multiple of 32 up to 256, 25% or 20%)", d_,
            boost_percent);
}

void KittyKeyCodec::encode(const float* x, uint8_t* block) const {
  uint8_t* slot = block + layout::kitty_slot_offset(d_, n_boost_);
  kitty_channel_map(x, d_, n_boost_, slot);
  uint8_t codes[kT], part[kT];
  for (int c = 0; c < d_; ++c) {
    const bool boosted = slot[c] < n_boost_;
    const layout::MinScale p = quantize_min_scale(x + c, kT, d_, boosted ? 4 : 2, kKittyEps, codes);
    std::memcpy(block + layout::kitty_params_offset(d_, n_boost_) + 4 * c, &p, 4);
    for (int t = 0; t < kT; ++t) part[t] = codes[t] & 3;
    layout::pack_codes(part, kT, 2, block + layout::kitty_low_offset() + c * layout::kKittyPlaneBytes);
    if (!boosted) continue;
    for (int t = 0; t < kT; ++t) part[t] = codes[t] >> 2;
    layout::pack_codes(part, kT, 2, block + layout::kitty_high_offset(d_) + slot[c] * layout::kKittyPlaneBytes);
  }
}

void KittyKeyCodec::decode(const uint8_t* block, float* x) const {
  const uint8_t* slot = block + layout::kitty_slot_offset(d_, n_boost_);
  const uint8_t* params = block + layout::kitty_params_offset(d_, n_boost_);
  for (int c = 0; c < d_; ++c) {
    const layout::MinScale p = params_at(params, c);
    const uint8_t* low = block + layout::kitty_low_offset() + c * layout::kKittyPlaneBytes;
    const uint8_t* high =
        slot[c] < n_boost_ ? block + layout::kitty_high_offset(d_) + slot[c] * layout::kKittyPlaneBytes : nullptr;
    for (int t = 0; t < kT; ++t) {
      const int code = layout::unpack_code(low, t, 2) | (high ? layout::unpack_code(high, t, 2) << 2 : 0);
      x[size_t(t) * d_ + c] = min_scale_dequant(uint8_t(code), p);
    }
  }
}

void KittyKeyCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % kT == 0, "{} keys: scores over n_q={} n_tokens={} (blocks of {})",
            name_, n_q, n_tokens, kT);
  std::vector<float> q1(size_t(n_q) * d_), q2(size_t(n_q) * n_boost_), tmp(size_t(n_q) * kT),
      bias(static_cast<size_t>(n_q));
  for (int b = 0; b < n_tokens / kT; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    const uint8_t* slot = block + layout::kitty_slot_offset(d_, n_boost_);
    const uint8_t* params = block + layout::kitty_params_offset(d_, n_boost_);
    std::fill(q2.begin(), q2.end(), 0.f);
    for (int i = 0; i < n_q; ++i) {
      float z = 0.f;
      for (int c = 0; c < d_; ++c) {
        const layout::MinScale p = params_at(params, c);
        const float qc = q[size_t(i) * d_ + c];
        q1[size_t(i) * d_ + c] = qc * fp16_to_f32(p.scale);
        z += qc * fp16_to_f32(p.min);
        if (slot[c] < n_boost_) q2[size_t(i) * n_boost_ + slot[c]] = 4.f * q1[size_t(i) * d_ + c];
      }
      bias[size_t(i)] = z;
    }
    std::fill(tmp.begin(), tmp.end(), 0.f);
    kernels_.accumulate(plane_rows(block + layout::kitty_low_offset(), d_), q1.data(), size_t(d_), n_q, tmp.data());
    kernels_.accumulate(plane_rows(block + layout::kitty_high_offset(d_), n_boost_), q2.data(), size_t(n_boost_), n_q,
                        tmp.data());
    for (int i = 0; i < n_q; ++i)
      for (int t = 0; t < kT; ++t)
        s[size_t(i) * n_tokens + size_t(b) * kT + t] = tmp[size_t(i) * kT + t] + bias[size_t(i)];
  }
}

void KittyKeyCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % kT == 0,
            "{} keys: accumulate over n_q={} n_tokens={} (blocks of {})", name_, n_q, n_tokens, kT);
  std::vector<float> pb(size_t(n_q) * kT), low(size_t(n_q) * d_), high(size_t(n_q) * n_boost_);
  for (int b = 0; b < n_tokens / kT; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    const uint8_t* slot = block + layout::kitty_slot_offset(d_, n_boost_);
    const uint8_t* params = block + layout::kitty_params_offset(d_, n_boost_);
    for (int i = 0; i < n_q; ++i)
      std::copy_n(p + size_t(i) * n_tokens + size_t(b) * kT, kT, pb.data() + size_t(i) * kT);
    kernels_.scores(plane_rows(block + layout::kitty_low_offset(), d_), pb.data(), n_q, low.data(), size_t(d_));
    kernels_.scores(plane_rows(block + layout::kitty_high_offset(d_), n_boost_), pb.data(), n_q, high.data(),
                    size_t(n_boost_));
    for (int i = 0; i < n_q; ++i) {
      float psum = 0.f;
      for (int t = 0; t < kT; ++t) psum += pb[size_t(i) * kT + t];
      for (int c = 0; c < d_; ++c) {
        const layout::MinScale m = params_at(params, c);
        float dot = low[size_t(i) * d_ + c];
        if (slot[c] < n_boost_) dot += 4.f * high[size_t(i) * n_boost_ + slot[c]];
        acc[size_t(i) * d_ + c] += fp16_to_f32(m.scale) * dot + fp16_to_f32(m.min) * psum;
      }
    }
  }
}

// --- Values.

KittyValueCodec::KittyValueCodec(std::string name, int head_dim, SimdLevel level)
    : name_(std::move(name)), d_(head_dim), kernels_(row_kernels(RowFormat::kInt2, level)) {
  KVQ_CHECK(d_ > 0 && d_ % 32 == 0 && d_ <= 256, "KittyValueCodec: head_dim {} (a multiple of 32 up to 256)", d_);
}

void KittyValueCodec::encode(const float* x, uint8_t* block) const {
  uint8_t codes[256];
  const layout::MinScale p = quantize_min_scale(x, d_, 1, 2, kKittyEps, codes);
  std::memcpy(block, &p, 4);
  layout::pack_codes(codes, d_, 2, block + 4);
}

void KittyValueCodec::decode(const uint8_t* block, float* x) const {
  const layout::MinScale p = params_at(block, 0);
  for (int c = 0; c < d_; ++c) x[c] = min_scale_dequant(layout::unpack_code(block + 4, c, 2), p);
}

RowsView KittyValueCodec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.codes_offset = 4;  // past the MinScale pair; read as plain codes (grouped = false), scaled here
  r.d = d_;
  r.group = d_;
  r.n_rows = n_tokens;
  return r;
}

void KittyValueCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{} values: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
  for (int i = 0; i < n_q; ++i) {
    float qsum = 0.f;
    for (int c = 0; c < d_; ++c) qsum += q[size_t(i) * d_ + c];
    for (int t = 0; t < n_tokens; ++t) {
      const layout::MinScale p = params_at(blocks + size_t(t) * bytes_per_block(), 0);
      float& st = s[size_t(i) * n_tokens + t];
      st = st * fp16_to_f32(p.scale) + fp16_to_f32(p.min) * qsum;
    }
  }
}

void KittyValueCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{} values: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  std::vector<float> w(size_t(n_q) * n_tokens), min_term(size_t(n_q), 0.f);
  for (int t = 0; t < n_tokens; ++t) {
    const layout::MinScale m = params_at(blocks + size_t(t) * bytes_per_block(), 0);
    const float sc = fp16_to_f32(m.scale), mn = fp16_to_f32(m.min);
    for (int i = 0; i < n_q; ++i) {
      const float pt = p[size_t(i) * n_tokens + t];
      w[size_t(i) * n_tokens + t] = pt * sc;
      min_term[size_t(i)] += pt * mn;
    }
  }
  kernels_.accumulate(rows(blocks, n_tokens), w.data(), size_t(n_tokens), n_q, acc);
  for (int i = 0; i < n_q; ++i)
    for (int c = 0; c < d_; ++c) acc[size_t(i) * d_ + c] += min_term[size_t(i)];
}

}  // namespace kvq
