// The group quantizer of codecs/group_quant.cpp on the device, in the two shapes the demotion kernels need: one group
// by a warp (per-token rows, codec_int.cuh) and one group serially by one thread (a KIVI key channel over its G
// tokens, codec_kivi.cuh). The per-element maths (scale and zero rounding, degenerate groups, codes) is
// codecs/group_quant.h's, shared with the host; the clip threshold (the order statistic the CPU selects) is found
// by counting.
#pragma once

#include "codecs/group_quant.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

// Warp-wide (value, index) minimum / maximum with the CPU's tie rule (the first index wins).
__device__ __forceinline__ void warp_argmin(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov < v || (ov == v && oi < i)) v = ov, i = oi;
  }
}
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}

// One group x[0, n) (n = G, a multiple of 32) quantized by the warp; codes[i] one per byte; returns params.
template <int BITS>
__device__ void quantize_group_warp(const float* x, int n, int clip_index, uint8_t* codes, uint16_t* scale_out,
                                    uint16_t* zero_out, float* thr_slot) {
  const int lane = threadIdx.x & 31;
  // Clip threshold: |x| sorted ascending at clip_index (the k-th smallest, by counting), or max |x|.
  if (clip_index < 0) {
    float m = 0.f;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, fabsf(x[i]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) *thr_slot = m;
  } else {
    for (int i = lane; i < n; i += 32) {
      const float a = fabsf(x[i]);
      int less = 0, leq = 0;
      for (int j = 0; j < n; ++j) {
        const float b = fabsf(x[j]);
        less += b < a;
        leq += b <= a;
      }
      if (less <= clip_index && clip_index < leq) *thr_slot = a;  // ties write the same value
    }
  }
  __syncwarp();
  const float thr = *thr_slot;
  float lo = INFINITY, hi = -INFINITY;
  int ilo = n, ihi = n;
  for (int i = lane; i < n; i += 32) {
    const float v = clip_value(x[i], thr);
    if (v < lo) lo = v, ilo = i;
    if (v > hi) hi = v, ihi = i;
  }
  warp_argmin(lo, ilo);
  warp_argmax(hi, ihi);
  const float scale = group_scale(lo, hi, BITS);
  if (group_degenerate(lo, hi, scale)) {
    *scale_out = degenerate_scale(lo);
    *zero_out = degenerate_zero(lo);
    for (int i = lane; i < n; i += 32) codes[i] = 0;
    return;
  }
  *scale_out = f32_to_fp16(scale);
  const uint16_t zbits = group_zero(lo, scale);
  *zero_out = zbits;
  const float zero = fp16_to_f32(zbits), levels = quant_levels(BITS);
  for (int i = lane; i < n; i += 32) codes[i] = quant_code(clip_value(x[i], thr), scale, zero, levels);
}

// Quantizer parameters of one group, the float operations of codecs/group_quant.cpp.
struct GroupParamsF {
  float thr;         // clip threshold
  float scale;       // fp16-rounded scale (as a float); unused when degenerate
  float zero;        // fp16-rounded zero (as a float)
  bool degenerate;   // every code is 0
  uint16_t scale_bits, zero_bits;  // as stored
};

// The group quantizer of codecs/group_quant.cpp over G values x(0 .. n-1), serially by one thread, in the CPU's loop
// order. X: a functor i -> float.
template <int BITS, class X>
__device__ GroupParamsF quantize_params_serial(const X& x, int n, int clip_index) {
  GroupParamsF q{};
  if (clip_index < 0) {
    float m = 0.f;
    for (int i = 0; i < n; ++i) m = fmaxf(m, fabsf(x(i)));
    q.thr = m;
  } else {  // the clip_index-th smallest |x| (the CPU's order statistic), by counting
    for (int i = 0; i < n; ++i) {
      const float a = fabsf(x(i));
      int less = 0, leq = 0;
      for (int j = 0; j < n; ++j) {
        const float b = fabsf(x(j));
        less += b < a;
        leq += b <= a;
      }
      if (less <= clip_index && clip_index < leq) {
        q.thr = a;
        break;
      }
    }
  }
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float v = clip_value(x(i), q.thr);
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const float scale = group_scale(lo, hi, BITS);
  if (group_degenerate(lo, hi, scale)) {
    q.degenerate = true;
    q.scale_bits = degenerate_scale(lo);
    q.zero_bits = degenerate_zero(lo);
    return q;
  }
  q.scale = scale;
  q.scale_bits = f32_to_fp16(scale);
  q.zero_bits = group_zero(lo, scale);
  q.zero = fp16_to_f32(q.zero_bits);
  return q;
}

// Code of value v under group parameters q (codecs/group_quant.cpp).
template <int BITS>
__device__ __forceinline__ uint32_t quantize_value(float v, const GroupParamsF& q) {
  if (q.degenerate) return 0;
  return quant_code(clip_value(v, q.thr), q.scale, q.zero, quant_levels(BITS));
}

}  // namespace kvq::cuda::dev
