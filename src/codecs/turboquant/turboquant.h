// TurboQuant's stored formats (docs/guide/methods.md §5.2; vLLM's merged backend is the "as shipped" reference): the
// block structs, the code packing and the per-element maths, shared by the CPU codecs
// (codecs/turboquant/codec_turboquant.h) and the GPU's demotion kernels (codecs/turboquant/codec_turboquant.cuh), so
// both devices store the same bytes. Plain C++ (KVQ_HD, exact:: operations of common/hd.h: never fused), includable
// from .cu files.
//
// Keys, codebook (tq2 / tq3 / tq4, norm-corrected tq2nc / tq3nc / tq4nc). The cache's KV transform has already rotated
// the key by the shared Hadamard (y = k·H; codecs/registry.h's transform column), so for a row y of d values:
//   n   = ||y||₂ in fp32, summed in the canonical order below (= ||k||: H is orthogonal)
//   x_i = y_i / (n + 1e-8)
//   idx_i = number of midpoints m with x_i >= m (ties go up; NaN gives 0), midpoints of the fp32 Lloyd–Max
//           centroids (codecs/turboquant/lloyd_max.h)
//   row = codes packed as below, then n as fp16:       TqKeyRow<d, b>: d·b/8 + 2 bytes (d = 128: 66 / 50 / 34)
//   x̂  = n · c with c_i = centroid[idx_i]; norm-corrected: c ← c / sqrt(Σ c_i² + 1e-16) (Σ in the canonical order)
// The spec takes n from the raw key and rotates x = k / (n + 1e-8); doing the rotation first (the transform) is the
// same in exact arithmetic and differs only by fp32 rounding.
//
// Keys, k8v4: FP8 e4m3 rows with no scale, the fp8e4m3 codec (codecs/fp8/fp8.h).
//
// Values (tqv2 / tqv3 / tqv4), per row over all d values, no clip, no rotation (codecs/min_scale_quant.h's grid):
//   mn, mx = min, max (fp32);  s = (mx - mn) / (2^b - 1), then s = 1e-8 unless s > 1e-8
//   code_i = clamp(floor((v_i - mn) / s + 0.5), 0, 2^b - 1)       with the fp32 s and mn
//   row = codes packed as below, then fp16(s), fp16(mn):      TqValueRow<d, b>: d·b/8 + 4 bytes (d = 128: 68 / 52 / 36)
//   v̂_i = code_i · fp16(s) + fp16(mn)                            (the stored fp16 values: vLLM's mismatch, kept)
//
// Packing of b-bit codes (keys and values), in each case the little-endian bit string with code i at bits b·i:
//   b = 4: byte j = code[2j] | code[2j + 1] << 4                   (two per byte, low nibble first)
//   b = 3: bytes 3g .. 3g + 2 = the 24-bit little-endian word Σ_t code[8g + t] << 3t (eight codes in three bytes)
//   b = 2: byte j = Σ_t code[4j + t] << 2t                         (four per byte, low bits first)
//
// Canonical order of the sums of squares (n and the norm correction), the one a warp computes with shuffles: lane l <
// 32 sums y_l², y_{l+32}², y_{l+64}², ... in that order, then the 32 partial sums are halved by pairs, p_l += p_{l+16},
// p_l += p_{l+8}, ..., p_0 += p_1. d must be a multiple of 32.
#pragma once

#include <stdint.h>

#include "codecs/min_scale_quant.h"
#include "common/half.h"
#include "common/hd.h"

namespace kvq::tq {

// --- Bytes of one stored row.
KVQ_HD constexpr int codes_bytes(int d, int bits) { return d * bits / 8; }
KVQ_HD constexpr int key_row_bytes(int d, int bits) { return codes_bytes(d, bits) + 2; }    // codes, fp16 n
KVQ_HD constexpr int value_row_bytes(int d, int bits) { return codes_bytes(d, bits) + 4; }  // codes, fp16 s, mn

template <int D, int BITS>
struct TqKeyRow {
  uint8_t codes[D * BITS / 8];  // centroid indices, packed
  uint16_t norm;                // fp16 bits of n = ||y||
};
template <int D, int BITS>
struct TqValueRow {
  uint8_t codes[D * BITS / 8];  // uniform codes, packed
  uint16_t scale;               // fp16 bits of s
  uint16_t min;                 // fp16 bits of mn
};

static_assert(sizeof(TqKeyRow<128, 4>) == 66 && key_row_bytes(128, 4) == 66, "tq4 keys d=128: 4.125 b");
static_assert(sizeof(TqKeyRow<128, 3>) == 50 && key_row_bytes(128, 3) == 50, "tq3 keys d=128: 3.125 b");
static_assert(sizeof(TqKeyRow<128, 2>) == 34 && key_row_bytes(128, 2) == 34, "tq2 keys d=128: 2.125 b");
static_assert(sizeof(TqKeyRow<64, 3>) == 26 && key_row_bytes(64, 3) == 26, "tq3 keys d=64");
static_assert(sizeof(TqValueRow<128, 4>) == 68 && value_row_bytes(128, 4) == 68, "tqv4 d=128: 4.25 b");
static_assert(sizeof(TqValueRow<128, 3>) == 52 && value_row_bytes(128, 3) == 52, "tqv3 d=128: 3.25 b");
static_assert(sizeof(TqValueRow<128, 2>) == 36 && value_row_bytes(128, 2) == 36, "tqv2 d=128: 2.25 b");
static_assert(sizeof(TqValueRow<64, 2>) == 20 && value_row_bytes(64, 2) == 20, "tqv2 d=64");

// --- Packing.

// Byte j of a packed row of one-per-byte codes (each < 2^bits, bits in {2, 3, 4}). Every width is the same
// little-endian bit string: code i occupies bits [bits·i, bits·i + bits) (b = 3: the 24-bit words of 8 codes are that).
KVQ_HD inline uint8_t pack_byte(const uint8_t* codes, int j, int bits) {
  if (bits == 3) {
    const int g = j / 3;
    uint32_t w = 0;
    for (int t = 0; t < 8; ++t) w |= uint32_t(codes[8 * g + t]) << (3 * t);
    return uint8_t(w >> (8 * (j % 3)));
  }
  const int per_byte = 8 / bits;
  uint32_t b = 0;
  for (int t = 0; t < per_byte; ++t) b |= uint32_t(codes[per_byte * j + t]) << (bits * t);
  return uint8_t(b);
}

// Pack d codes into out[codes_bytes(d, bits)].
KVQ_HD inline void pack(const uint8_t* codes, int d, int bits, uint8_t* out) {
  for (int j = 0; j < codes_bytes(d, bits); ++j) out[j] = pack_byte(codes, j, bits);
}

// Code i of a packed row.
KVQ_HD inline uint8_t unpack(const uint8_t* packed, int i, int bits) {
  if (bits == 3) {
    const uint8_t* p = packed + 3 * (i / 8);
    const uint32_t w = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
    return uint8_t((w >> (3 * (i % 8))) & 7u);
  }
  const int per_byte = 8 / bits;
  return uint8_t((packed[i / per_byte] >> (bits * (i % per_byte))) & ((1u << bits) - 1u));
}

// --- The sums of squares in the canonical order (header comment).

// Lane l's partial sum: y_l², y_{l+32}², ... of a row of d values.
KVQ_HD inline float lane_sum_squares(const float* y, int d, int lane) {
  float s = 0.f;
  for (int i = lane; i < d; i += 32) s = exact::add(s, exact::mul(y[i], y[i]));
  return s;
}
// Σ y_i² of a row (d a multiple of 32): the 32 lane partials, halved by pairs.
KVQ_HD inline float sum_squares(const float* y, int d) {
  float p[32];
  for (int l = 0; l < 32; ++l) p[l] = lane_sum_squares(y, d, l);
  for (int half = 16; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) p[l] = exact::add(p[l], p[l + half]);
  return p[0];
}

KVQ_HD inline float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);  // IEEE, correctly rounded
#endif
}

// --- Codebook keys.

// 1 / (n + 1e-8)'s denominator: x_i = y_i / key_denominator(n).
KVQ_HD inline float key_denominator(float n) { return exact::add(n, 1e-8f); }
// The centroid index of a normalised coordinate: how many of the n_mid sorted midpoints are <= x.
KVQ_HD inline uint8_t bucket(float x, const float* midpoints, int n_mid) {
  int idx = 0;
  for (int j = 0; j < n_mid; ++j) idx += x >= midpoints[j];
  return uint8_t(idx);
}
// The norm correction's divisor sqrt(Σ c_i² + 1e-16) from the centroid vector's sum of squares.
KVQ_HD inline float centroid_norm(float sum_sq) { return sqrt_rn(exact::add(sum_sq, 1e-16f)); }

// --- Values.

// The min / scale grid of codecs/min_scale_quant.h with TurboQuant's least scale.
constexpr float kValueEps = 1e-8f;
KVQ_HD inline float value_scale(float mn, float mx, int bits) { return min_scale_step(mn, mx, bits, kValueEps); }

}  // namespace kvq::tq
