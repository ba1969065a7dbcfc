#include "codecs/turboquant/codec_turboquant.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "codecs/turboquant/turboquant.h"
#include "common/error.h"
#include "common/half.h"

namespace kvq {

namespace {

// The table of a byte's 8 / b entries (b in {2, 4}), low bits first: table[byte · (8 / b) + t] = entry[code t].
std::vector<float> byte_table(const float* entry, int bits) {
  if (bits == 3) return {};
  const int per = 8 / bits, mask = (1 << bits) - 1;
  std::vector<float> t(size_t(256) * per);
  for (int byte = 0; byte < 256; ++byte)
    for (int k = 0; k < per; ++k) t[size_t(byte) * per + k] = entry[(byte >> (bits * k)) & mask];
  return t;
}

// out[i · kStride] <- entry[code i] of d packed b-bit codes: byte tables for b in {2, 4}, 24-bit words for b = 3.
// kStride 1: a row-major row; kStride kTile: column t of a transposed tile.
template <int kStride>
inline void expand(const uint8_t* packed, int d, int bits, const float* entry, const std::vector<float>& table,
                   float* out) {
  constexpr int stride = kStride;
  if (bits == 3) {
    for (int g = 0; g < d / 8; ++g) {
      const uint8_t* p = packed + 3 * g;
      const uint32_t w = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
      for (int t = 0; t < 8; ++t) out[(8 * g + t) * stride] = entry[(w >> (3 * t)) & 7u];
    }
    return;
  }
  const int per = 8 / bits;
  for (int j = 0; j < d / per; ++j) {
    const float* e = &table[size_t(packed[j]) * per];
    for (int k = 0; k < per; ++k) out[(per * j + k) * stride] = e[k];
  }
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

void check_bits(std::string_view who, int bits, int head_dim) {
  KVQ_CHECK((bits == 2 || bits == 3 || bits == 4) && head_dim > 0 && head_dim % 32 == 0 && head_dim <= 256,
            "{}: bits {} head_dim {} (bits 2, 3, 4; head_dim a multiple of 32 up to 256)", who, bits, head_dim);
}

constexpr int kMaxD = 256;
using tq::kTile;

}  // namespace

// --- Codebook keys.

TqKeyCodec::TqKeyCodec(std::string name, int head_dim, int bits, bool norm_correction, SimdLevel level)
    : name_(std::move(name)), d_(head_dim), bits_(bits), norm_correction_(norm_correction),
      cb_((check_bits(name_, bits, head_dim), lloyd_max_codebook(head_dim, bits))),
      byte_centroids_(byte_table(cb_.centroids.data(), bits)), kernels_(tq::tile_kernels(level)) {
  if (bits == 3) return;
  const int per = 8 / bits;
  for (int b = 0; b < 256; ++b)
    for (int k = 0; k < per; ++k) {
      const float c = byte_centroids_[size_t(b) * per + k];
      byte_sum_sq_[b] += c * c;
    }
}

size_t TqKeyCodec::bytes_per_block() const { return size_t(tq::key_row_bytes(d_, bits_)); }

std::vector<uint8_t> TqKeyCodec::device_table() const {
  std::vector<float> t = cb_.centroids;
  t.insert(t.end(), cb_.midpoints.begin(), cb_.midpoints.end());
  std::vector<uint8_t> bytes(t.size() * sizeof(float));
  std::memcpy(bytes.data(), t.data(), bytes.size());
  return bytes;
}

void TqKeyCodec::encode(const float* y, uint8_t* block) const {
  const float n = tq::sqrt_rn(tq::sum_squares(y, d_));
  const float den = tq::key_denominator(n);
  uint8_t idx[256];
  for (int i = 0; i < d_; ++i)
    idx[i] = tq::bucket(exact::div(y[i], den), cb_.midpoints.data(), int(cb_.midpoints.size()));
  tq::pack(idx, d_, bits_, block);
  store_u16(block + tq::codes_bytes(d_, bits_), f32_to_fp16(n));
}

void TqKeyCodec::decode(const uint8_t* block, float* x) const {
  float c[256];
  for (int i = 0; i < d_; ++i) c[i] = cb_.centroids[tq::unpack(block, i, bits_)];
  const float n = fp16_to_f32(load_u16(block + tq::codes_bytes(d_, bits_)));
  const float r = norm_correction_ ? tq::centroid_norm(tq::sum_squares(c, d_)) : 1.f;
  for (int i = 0; i < d_; ++i) x[i] = n * (norm_correction_ ? c[i] / r : c[i]);
}

float TqKeyCodec::centroids(const uint8_t* codes, float* xt, int t) const {
  expand<kTile>(codes, d_, bits_, cb_.centroids.data(), byte_centroids_, xt + t);
  if (!norm_correction_) return 0.f;
  float sq = 0.f;
  if (bits_ == 3) {
    for (int c = 0; c < d_; ++c) sq += xt[c * kTile + t] * xt[c * kTile + t];
  } else {
    for (int j = 0; j < tq::codes_bytes(d_, bits_); ++j) sq += byte_sum_sq_[codes[j]];
  }
  return sq;
}

void TqKeyCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  const size_t bpb = bytes_per_block();
  float xt[kMaxD * kTile], f[kTile];
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int n = std::min(kTile, n_tokens - t0);
    if (n < kTile) std::fill(xt, xt + d_ * kTile, 0.f), std::fill(f, f + kTile, 0.f);
    for (int t = 0; t < n; ++t) {
      const uint8_t* row = blocks + size_t(t0 + t) * bpb;
      const float sum_sq = centroids(row, xt, t);
      const float norm = fp16_to_f32(load_u16(row + tq::codes_bytes(d_, bits_)));
      f[t] = norm_correction_ ? norm / tq::centroid_norm(sum_sq) : norm;
    }
    kernels_.scores(q, n_q, xt, n, d_, f, s + t0, size_t(n_tokens));
  }
}

// --- Uniform values.

namespace {
constexpr float kCodeValues[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
}  // namespace

TqValueCodec::TqValueCodec(std::string name, int head_dim, int bits, SimdLevel level)
    : name_(std::move(name)), d_(head_dim), bits_(bits),
      byte_codes_((check_bits(name_, bits, head_dim), byte_table(kCodeValues, bits))),
      kernels_(tq::tile_kernels(level)) {}

size_t TqValueCodec::bytes_per_block() const { return size_t(tq::value_row_bytes(d_, bits_)); }

void TqValueCodec::encode(const float* v, uint8_t* block) const {
  float mn = v[0], mx = v[0];
  for (int i = 1; i < d_; ++i) {
    if (v[i] < mn) mn = v[i];
    if (v[i] > mx) mx = v[i];
  }
  const float s = tq::value_scale(mn, mx, bits_);
  uint8_t code[256];
  for (int i = 0; i < d_; ++i) code[i] = min_scale_code(v[i], mn, s, bits_);
  tq::pack(code, d_, bits_, block);
  uint8_t* params = block + tq::codes_bytes(d_, bits_);
  store_u16(params, f32_to_fp16(s));
  store_u16(params + 2, f32_to_fp16(mn));
}

void TqValueCodec::decode(const uint8_t* block, float* x) const {
  const uint8_t* params = block + tq::codes_bytes(d_, bits_);
  const float s = fp16_to_f32(load_u16(params)), mn = fp16_to_f32(load_u16(params + 2));
  for (int i = 0; i < d_; ++i) x[i] = min_scale_value(float(tq::unpack(block, i, bits_)), s, mn);
}

void TqValueCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  constexpr int kMaxQ = 64;  // queries per pass: their weights and offsets live on the stack
  const size_t bpb = bytes_per_block();
  float x[kTile * kMaxD], w[kMaxQ * kTile];
  for (int i0 = 0; i0 < n_q; i0 += kMaxQ) {
    const int nq = std::min(kMaxQ, n_q - i0);
    float offset[kMaxQ] = {};  // Σ_t p_it · mn_t
    for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
      const int n = std::min(kTile, n_tokens - t0);
      for (int t = 0; t < n; ++t) {
        const uint8_t* row = blocks + size_t(t0 + t) * bpb;
        const uint8_t* params = row + tq::codes_bytes(d_, bits_);
        const float sc = fp16_to_f32(load_u16(params)), mn = fp16_to_f32(load_u16(params + 2));
        expand<1>(row, d_, bits_, kCodeValues, byte_codes_, x + t * d_);
        for (int i = 0; i < nq; ++i) {
          const float pt = p[size_t(i0 + i) * n_tokens + t0 + t];
          w[i * kTile + t] = pt * sc;
          offset[i] += pt * mn;
        }
      }
      kernels_.accumulate(w, nq, x, n, d_, acc + size_t(i0) * d_);
    }
    for (int i = 0; i < nq; ++i)
      for (int c = 0; c < d_; ++c) acc[size_t(i0 + i) * d_ + c] += offset[i];
  }
}

}  // namespace kvq
