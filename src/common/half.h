// Scalar bf16 / fp16 <-> fp32 conversions (round to nearest even). Used by loaders, codecs and caches.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

namespace kvq {

using bf16_t = uint16_t;  // raw bfloat16 bits
using fp16_t = uint16_t;  // raw IEEE half bits

inline float bf16_to_f32(bf16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t(u >> 16);
}

inline float fp16_to_f32(fp16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline fp16_t f32_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16_t(sign | 0x7e00u);       // NaN
  if (abs >= 0x477ff000u) return fp16_t(sign | 0x7c00u);      // overflow -> inf (65520 and up)
  if (abs < 0x38800000u) {  // fp16 subnormal (or zero): value = m * 2^-24, m rounded to nearest even
    float a;
    std::memcpy(&a, &abs, 4);
    return fp16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));  // m == 1024 is the smallest normal
  }
  uint32_t v = abs - 0x38000000u;  // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);  // round to nearest even
  return fp16_t(sign | (v >> 13));
}

}  // namespace kvq
