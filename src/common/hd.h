// Scalar code shared by the host and the device compilers: KVQ_HD marks a function __host__ __device__ under nvcc,
// and the float operations below are the exact IEEE ones (round to nearest even) on both sides.
//
// Why the wrappers: nvcc compiles device code with -fmad=true, which may fuse a * b + c into one fma and so change
// the rounding; the __f*_rn intrinsics are never fused. The host is compiled for baseline x86-64 (no FMA, SSE
// arithmetic), where plain operators already round each operation. Shared bit-exact maths (common/half.h,
// codecs/group_quant.h) is written with these, so the host and the GPU compute the same bits.
#pragma once

#include <stdint.h>

#include <cmath>
#include <cstring>

// As codecs/layout.h defines it (an identical redefinition is allowed).
#ifndef KVQ_HD
#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__
#else
#define KVQ_HD
#endif
#endif

namespace kvq::exact {

KVQ_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVQ_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KVQ_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVQ_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// The same in double precision (the sampler's arithmetic: model/sampling_math.h).
KVQ_HD inline double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KVQ_HD inline double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KVQ_HD inline double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// Nearest integer, ties to even (the default rounding mode on the host).
KVQ_HD inline float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
// Nearest integer, ties away from zero (C's roundf).
KVQ_HD inline float round_away(float x) {
#if defined(__CUDA_ARCH__)
  return roundf(x);
#else
  return std::round(x);
#endif
}
KVQ_HD inline float floor(float x) {
#if defined(__CUDA_ARCH__)
  return floorf(x);
#else
  return std::floor(x);
#endif
}
KVQ_HD inline float abs(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}
// Correctly rounded square root (IEEE; __fsqrt_rn whatever nvcc's -prec-sqrt).
KVQ_HD inline float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
KVQ_HD inline bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}
// The bits of a float and back.
KVQ_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVQ_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace kvq::exact
