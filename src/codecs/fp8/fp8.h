// FP8 KV-cache formats as vLLM ships them (--kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2 / fp8_per_token_head): the
// element conversions, the row layouts and the per-row maths, shared by the CPU codecs (codecs/fp8/codec_fp8.h) and
// the GPU's device codec (codecs/fp8/codec_fp8.cuh), so that both devices store the same bytes. Plain C++ (KVQ_HD,
// exact:: operations of common/hd.h: never fused), includable from .cu files.
//
// Elements (OCP FP8), round to nearest even, SATURATING: out-of-range values and ±inf store the largest finite value
// of their sign, NaN stores 0x7f. This is vLLM's store path (cvt.rn.satfinite, __NV_SATFINITE in its CUDA cache
// kernels; Triton's fp32 -> fp8 casts on sm_89+); a KV cache must not make NaNs or infinities.
//   e4m3 (e4m3fn): bias 7, no infinities, 0x7f / 0xff NaN, max 448, smallest subnormal 2^-9
//   e5m2:          bias 15, 0x7c infinity (never stored), max 57344, smallest subnormal 2^-16
//
// Rows of one (token, kv head), d values:
//   fp8 / fp8_e4m3 / fp8_e5m2 (Fp8Row<d>: d bytes): code_i = fp8(x_i / s) with vLLM's per-tensor scale s; kvq stores
//     s = 1.0, vLLM's default when the checkpoint carries no k_scale / v_scale: code_i = fp8(x_i), x̂_i = fp8⁻¹(code_i)
//   fp8_per_token_head (Fp8ScaledRow<d>: d bytes, then an fp32 scale; vLLM's per-(token, head) scales, stored beside
//     the codes there and inside the row here, the same bytes either way):
//     s = max(absmax / 448, 1e-6),   code_i = fp8_e4m3(clamp(x_i · (1 / s), -448, 448)),   x̂_i = fp8⁻¹(code_i) · s
//     (the clamp is the saturation above).
#pragma once

#include <stdint.h>

#include "codecs/codec_id.h"
#include "common/hd.h"

namespace kvq::fp8 {

enum class Format : uint8_t { kE4m3, kE5m2 };

// The element format of an FP8 codec (fp8e5m2: e5m2; fp8e4m3 and fp8_per_token_head: e4m3), and the codec whose
// unscaled rows a per-tensor scale of a format applies to (fp8e4m3, fp8e5m2: codecs/fp8/fp8_scales.h).
KVQ_HD constexpr Format format_of(CodecId id) { return id == CodecId::kFp8e5m2 ? Format::kE5m2 : Format::kE4m3; }
KVQ_HD constexpr CodecId unscaled_row_of(Format f) {
  return f == Format::kE4m3 ? CodecId::kFp8e4m3 : CodecId::kFp8e5m2;
}

// --- Elements (header comment: round to nearest even, saturating, NaN -> 0x7f).

KVQ_HD inline uint8_t f32_to_e4m3(float f) {
  const uint32_t u = exact::float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                   // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7e);  // |f| >= 448 (and inf): saturate to 448
  if (a < 0x3c800000u) {  // |f| < 2^-6: e4m3 subnormal m · 2^-9, m rounded to nearest even (m = 8: the smallest normal)
    return uint8_t(sign | uint8_t(exact::round_even(exact::mul(exact::bits_float(a), 512.f))));
  }
  uint32_t v = a - ((127u - 7u) << 23);     // rebias exponent 127 -> 7
  v += 0x7ffffu + ((v >> 20) & 1u);         // round the 23-bit mantissa to 3 bits, ties to even
  return uint8_t(sign | uint8_t(v >> 20));  // < 448 rounds to at most 448 (0x7e)
}

KVQ_HD inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15 && m == 7) return exact::bits_float(sign | 0x7fc00000u);  // NaN
  if (e == 0) {  // subnormal: m · 2^-9
    const float x = exact::mul(float(m), 1.f / 512.f);
    return sign ? -x : x;
  }
  return exact::bits_float(sign | ((e + 127u - 7u) << 23) | (m << 20));
}

KVQ_HD inline uint8_t f32_to_e5m2(float f) {
  const uint32_t u = exact::float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                   // NaN
  if (a >= 0x47600000u) return uint8_t(sign | 0x7b);  // |f| >= 57344 (and inf): saturate to 57344
  if (a < 0x38800000u) {  // |f| < 2^-14: subnormal m · 2^-16, m rounded to nearest even (m = 4: the smallest normal)
    return uint8_t(sign | uint8_t(exact::round_even(exact::mul(exact::bits_float(a), 65536.f))));
  }
  uint32_t v = a - ((127u - 15u) << 23);    // rebias exponent 127 -> 15
  v += 0xfffffu + ((v >> 21) & 1u);         // round the 23-bit mantissa to 2 bits, ties to even
  return uint8_t(sign | uint8_t(v >> 21));  // < 57344 rounds to at most 57344 (0x7b)
}

KVQ_HD inline float e5m2_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 2) & 0x1fu, m = b & 3u;
  if (e == 31) return exact::bits_float(sign | (m ? 0x7fc00000u : 0x7f800000u));  // inf, NaN (never stored)
  if (e == 0) {  // subnormal: m · 2^-16
    const float x = exact::mul(float(m), 1.f / 65536.f);
    return sign ? -x : x;
  }
  return exact::bits_float(sign | ((e + 127u - 15u) << 23) | (m << 21));
}

template <Format F>
KVQ_HD inline uint8_t encode(float x) {
  if constexpr (F == Format::kE4m3) {
    return f32_to_e4m3(x);
  } else {
    return f32_to_e5m2(x);
  }
}
template <Format F>
KVQ_HD inline float decode(uint8_t b) {
  if constexpr (F == Format::kE4m3) {
    return e4m3_to_f32(b);
  } else {
    return e5m2_to_f32(b);
  }
}

// --- Rows.

template <int D>
struct Fp8Row {
  uint8_t codes[D];  // fp8 bits, value order
};
template <int D>
struct Fp8ScaledRow {
  uint8_t codes[D];  // e4m3 bits of x · (1 / s)
  float scale;       // s
};
KVQ_HD constexpr int row_bytes(int d, bool scaled) { return d + (scaled ? 4 : 0); }
static_assert(sizeof(Fp8Row<128>) == 128 && row_bytes(128, false) == 128, "fp8 d=128: 8 b");
static_assert(sizeof(Fp8ScaledRow<128>) == 132 && row_bytes(128, true) == 132, "fp8_per_token_head d=128: 8.25 b");
static_assert(sizeof(Fp8ScaledRow<64>) == 68 && row_bytes(64, true) == 68, "fp8_per_token_head d=64");

// The per-token-head scale of a row of largest magnitude absmax (header comment), and its reciprocal.
constexpr float kE4m3Max = 448.f;
constexpr float kMinScale = 1e-6f;
KVQ_HD inline float token_head_scale(float absmax) {
  const float s = exact::div(absmax, kE4m3Max);
  return s > kMinScale ? s : kMinScale;  // NaN absmax: the least scale
}
KVQ_HD inline float inverse_scale(float s) { return exact::div(1.f, s); }

}  // namespace kvq::fp8
