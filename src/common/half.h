// Scalar bf16 / fp16 <-> fp32 conversions (round to nearest even), bit-exact and shared by the host and the GPU
// (KVQ_HD, common/hd.h): loaders, codecs and caches on the CPU, the cache kernels on the device.
#pragma once

#include <cstdint>

#include "common/hd.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace kvq {

using bf16_t = uint16_t;  // raw bfloat16 bits
using fp16_t = uint16_t;  // raw IEEE half bits

KVQ_HD inline float bf16_to_f32(bf16_t h) { return exact::bits_float(uint32_t(h) << 16); }

KVQ_HD inline bf16_t f32_to_bf16(float f) {
  uint32_t u = exact::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t(u >> 16);
}

KVQ_HD inline float fp16_to_f32(fp16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));  // exact, one instruction
#else
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
  return exact::bits_float(u);
#endif
}

KVQ_HD inline fp16_t f32_to_fp16(float f) {
  const uint32_t u = exact::float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16_t(sign | 0x7e00u);       // NaN
  if (abs >= 0x477ff000u) return fp16_t(sign | 0x7c00u);      // overflow -> inf (65520 and up)
  if (abs < 0x38800000u) {  // fp16 subnormal (or zero): value = m * 2^-24, m rounded to nearest even
    // m == 1024 is the smallest normal
    return fp16_t(sign | uint32_t(exact::round_even(exact::mul(exact::bits_float(abs), 16777216.0f))));
  }
  uint32_t v = abs - 0x38000000u;  // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);  // round to nearest even
  return fp16_t(sign | (v >> 13));
}

}  // namespace kvq
