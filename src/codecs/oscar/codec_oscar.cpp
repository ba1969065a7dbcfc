#include "codecs/oscar/codec_oscar.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "codecs/oscar/oscar_format.h"
#include "common/error.h"

namespace kvq {

namespace {

using layout::kOscarBits;
using layout::kOscarGroup;

layout::OscarParams params_at(const uint8_t* base, int g) {
  layout::OscarParams p;
  std::memcpy(&p, base + 4 * g, 4);
  return p;
}
void put_params(uint8_t* base, int g, const OscarGroup& q) {
  const layout::OscarParams p{q.scale_bits, q.zero_bits};
  std::memcpy(base + 4 * g, &p, 4);
}

// n rows of plain 2-bit codes (no params), row t at rows + t·stride: what the row kernels read without groups.
RowsView code_rows(const uint8_t* rows, size_t stride, int d, int n) {
  RowsView r;
  r.rows = rows;
  r.row_stride = stride;
  r.d = d;
  r.group = d;
  r.n_rows = n;
  return r;
}

void check_d(int d) {
  KVQ_CHECK(d > 0 && d % 32 == 0 && d <= 256, "oscar_int2: head_dim {} (supported: multiples of 32 up to 256)", d);
}

}  // namespace

// --- Keys: blocks of 32 tokens, one group per channel.

OscarKeyCodec::OscarKeyCodec(int head_dim, SimdLevel level)
    : d_(head_dim), kernels_(row_kernels(RowFormat::kInt2, level)) {
  check_d(d_);
}

int OscarKeyCodec::tokens_per_block() const { return kOscarGroup; }

size_t OscarKeyCodec::bytes_per_block() const { return size_t(layout::oscar_key_block_bytes(d_)); }

void OscarKeyCodec::encode(const float* x, uint8_t* block) const {
  uint8_t codes[kOscarGroup * 256];  // [token][channel], one code per byte
  for (int c = 0; c < d_; ++c) {
    const auto col = [&](int t) { return x[size_t(t) * d_ + c]; };
    const OscarGroup q = oscar_group_of(col, kOscarGroup);
    put_params(block, c, q);
    for (int t = 0; t < kOscarGroup; ++t) codes[t * d_ + c] = oscar_code(col(t), q);
  }
  const int row_bytes = layout::packed_bytes(d_, kOscarBits);
  uint8_t* rows = block + layout::oscar_key_params_bytes(d_);
  for (int t = 0; t < kOscarGroup; ++t) layout::pack_codes(codes + t * d_, d_, kOscarBits, rows + t * row_bytes);
}

void OscarKeyCodec::decode(const uint8_t* block, float* x) const {
  const int row_bytes = layout::packed_bytes(d_, kOscarBits);
  const uint8_t* rows = block + layout::oscar_key_params_bytes(d_);
  for (int c = 0; c < d_; ++c) {
    const layout::OscarParams p = params_at(block, c);
    for (int t = 0; t < kOscarGroup; ++t)
      x[size_t(t) * d_ + c] =
          oscar_dequant(layout::unpack_code(rows + t * row_bytes, c, kOscarBits), p.scale, p.zero_dequant);
  }
}

void OscarKeyCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % kOscarGroup == 0,
            "oscar_int2 keys: scores over n_q={} n_tokens={} (blocks of {})", n_q, n_tokens, kOscarGroup);
  std::vector<float> qs(size_t(n_q) * d_), bias(static_cast<size_t>(n_q));
  float scale[256], zero[256];
  for (int b = 0; b < n_tokens / kOscarGroup; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    for (int c = 0; c < d_; ++c) {
      const layout::OscarParams p = params_at(block, c);
      scale[c] = fp16_to_f32(p.scale);
      zero[c] = fp16_to_f32(p.zero_dequant);
    }
    for (int i = 0; i < n_q; ++i) {
      float z = 0.f;
      for (int c = 0; c < d_; ++c) {
        qs[size_t(i) * d_ + c] = q[size_t(i) * d_ + c] * scale[c];
        z += q[size_t(i) * d_ + c] * zero[c];
      }
      bias[size_t(i)] = z;
    }
    float* sb = s + size_t(b) * kOscarGroup;
    kernels_.scores(code_rows(block + layout::oscar_key_params_bytes(d_), size_t(layout::packed_bytes(d_, kOscarBits)),
                              d_, kOscarGroup),
                    qs.data(), n_q, sb, size_t(n_tokens));
    for (int i = 0; i < n_q; ++i)
      for (int t = 0; t < kOscarGroup; ++t) sb[size_t(i) * n_tokens + t] += bias[size_t(i)];
  }
}

void OscarKeyCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % kOscarGroup == 0,
            "oscar_int2 keys: accumulate over n_q={} n_tokens={} (blocks of {})", n_q, n_tokens, kOscarGroup);
  std::vector<float> tmp(size_t(n_q) * d_);
  for (int b = 0; b < n_tokens / kOscarGroup; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    const float* pb = p + size_t(b) * kOscarGroup;
    std::fill(tmp.begin(), tmp.end(), 0.f);
    kernels_.accumulate(code_rows(block + layout::oscar_key_params_bytes(d_),
                                  size_t(layout::packed_bytes(d_, kOscarBits)), d_, kOscarGroup),
                        pb, size_t(n_tokens), n_q, tmp.data());
    for (int i = 0; i < n_q; ++i) {
      float psum = 0.f;
      for (int t = 0; t < kOscarGroup; ++t) psum += pb[size_t(i) * n_tokens + t];
      for (int c = 0; c < d_; ++c) {
        const layout::OscarParams pc = params_at(block, c);
        acc[size_t(i) * d_ + c] +=
            fp16_to_f32(pc.scale) * tmp[size_t(i) * d_ + c] + fp16_to_f32(pc.zero_dequant) * psum;
      }
    }
  }
}

// --- Values: per-token rows, one group per 32 channels.

OscarValueCodec::OscarValueCodec(int head_dim, SimdLevel level)
    : d_(head_dim), kernels_(row_kernels(RowFormat::kInt2, level)) {
  check_d(d_);
}

size_t OscarValueCodec::bytes_per_block() const { return size_t(layout::oscar_value_row_bytes(d_)); }

void OscarValueCodec::encode(const float* x, uint8_t* block) const {
  uint8_t codes[256];
  for (int g = 0; g < d_ / kOscarGroup; ++g) {
    const float* xg = x + g * kOscarGroup;
    const OscarGroup q = oscar_group_of([&](int i) { return xg[i]; }, kOscarGroup);
    put_params(block, g, q);
    for (int i = 0; i < kOscarGroup; ++i) codes[g * kOscarGroup + i] = oscar_code(xg[i], q);
  }
  layout::pack_codes(codes, d_, kOscarBits, block + layout::oscar_value_params_bytes(d_));
}

void OscarValueCodec::decode(const uint8_t* block, float* x) const {
  const uint8_t* packed = block + layout::oscar_value_params_bytes(d_);
  for (int g = 0; g < d_ / kOscarGroup; ++g) {
    const layout::OscarParams p = params_at(block, g);
    for (int c = g * kOscarGroup; c < (g + 1) * kOscarGroup; ++c)
      x[c] = oscar_dequant(layout::unpack_code(packed, c, kOscarBits), p.scale, p.zero_dequant);
  }
}

void OscarValueCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "oscar_int2 values: accumulate over n_q={} n_tokens={}", n_q, n_tokens);
  const size_t row = bytes_per_block(), nt = size_t(n_tokens);
  std::vector<float> w(size_t(n_q) * nt), tmp(size_t(n_q) * kOscarGroup);
  for (int g = 0; g < d_ / kOscarGroup; ++g) {
    // The group's 32 channels of every row as plain code rows, weighted by p·scale; the zero term once per query.
    std::vector<float> zsum(static_cast<size_t>(n_q), 0.f);
    for (int t = 0; t < n_tokens; ++t) {
      const layout::OscarParams pt = params_at(blocks + size_t(t) * row, g);
      const float sc = fp16_to_f32(pt.scale), zd = fp16_to_f32(pt.zero_dequant);
      for (int i = 0; i < n_q; ++i) {
        const float pi = p[size_t(i) * nt + size_t(t)];
        w[size_t(i) * nt + size_t(t)] = pi * sc;
        zsum[size_t(i)] += pi * zd;
      }
    }
    std::fill(tmp.begin(), tmp.end(), 0.f);
    const uint8_t* codes = blocks + layout::oscar_value_params_bytes(d_) + g * layout::unit_bytes(kOscarBits);
    kernels_.accumulate(code_rows(codes, row, kOscarGroup, n_tokens), w.data(), nt, n_q, tmp.data());
    for (int i = 0; i < n_q; ++i)
      for (int c = 0; c < kOscarGroup; ++c)
        acc[size_t(i) * d_ + g * kOscarGroup + c] += tmp[size_t(i) * kOscarGroup + c] + zsum[size_t(i)];
  }
}

}  // namespace kvq
