// The INT-b group quantizer of docs/guide/methods.md §1 (OSCAR / OptR grid): the single definition shared by the
// cache codecs (int8/int4/int2, KIVI), by calibration's straight-through quantizer and (its per-element maths,
// KVQ_HD) by the GPU cache's demotion kernels (codecs/group_quant.cuh), so both devices store the same bits.
//
// For one group x[0..n):
//   thr   = |x| sorted ascending at index min(floor(clip * n), n - 1);   x_c = clamp(x, -thr, thr)
//   scale = (max(x_c) - min(x_c)) / (2^bits - 1),  zero = -min(x_c) / scale   (both rounded to fp16, stored)
//   code  = clamp(floor(x_c / scale + zero + 0.5), 0, 2^bits - 1)            (uses the fp16-rounded values)
//   x̂     = (code - zero) * scale
// Degenerate groups (max == min, or a range too small for an fp16 scale) store scale = |min|, zero = -sign(min)
// and code 0, so x̂ = min exactly whenever min is representable in fp16.
// Every operation is one IEEE float operation in this order (exact::, common/hd.h: never fused into an fma).
#pragma once

#include <cstdint>

#include "common/half.h"

namespace kvq {

struct GroupQuant {
  fp16_t scale;  // fp16 bits, as stored
  fp16_t zero;   // fp16 bits, as stored
  float thr;     // clip threshold used (not stored; for calibration's straight-through estimator)
  int i_min;     // index of the element that set min(x_c) / max(x_c) (ties: first), for the STE backward
  int i_max;
};

// The clip's index in a group of n values' |x| sorted ascending: min(floor(clip · n), n - 1), or -1 for clip >= 1 (the
// threshold is then the largest |x|). The CPU's threshold and the GPU's demotions (their clip_index) take it here.
int clip_quantile_index(float clip, int n);

// Quantize one group of n values; writes one code per byte into codes[0..n).
GroupQuant quantize_group(const float* x, int n, int bits, float clip, uint8_t* codes);

// --- The per-element maths of quantize_group, for the host and the device.

// x_c = clamp(x, -thr, thr) (std::clamp's comparisons).
KVQ_HD inline float clip_value(float x, float thr) { return x < -thr ? -thr : (thr < x ? thr : x); }
// 2^bits - 1.
KVQ_HD inline float quant_levels(int bits) { return float((1 << bits) - 1); }
// The fp16-rounded scale of a group whose clipped values span [lo, hi], as a float.
KVQ_HD inline float group_scale(float lo, float hi, int bits) {
  return fp16_to_f32(f32_to_fp16(exact::div(exact::sub(hi, lo), quant_levels(bits))));
}
// A group with no range, or one too small (or too large) for an fp16 scale: stored as degenerate_params.
KVQ_HD inline bool group_degenerate(float lo, float hi, float scale) {
  return !(hi > lo) || !(scale > 0.f) || !exact::is_finite(scale);
}
// The stored scale and zero of a degenerate group: |lo| and -sign(lo), with every code 0 (x̂ = lo).
KVQ_HD inline fp16_t degenerate_scale(float lo) { return f32_to_fp16(exact::abs(lo)); }
KVQ_HD inline fp16_t degenerate_zero(float lo) { return f32_to_fp16(lo < 0.f ? 1.f : (lo > 0.f ? -1.f : 0.f)); }
// The stored zero -lo / scale (scale: the fp16-rounded group_scale).
KVQ_HD inline fp16_t group_zero(float lo, float scale) { return f32_to_fp16(exact::div(-lo, scale)); }
// The code of a clipped value x_c: clamp(floor(x_c / scale + zero + 0.5), 0, levels), scale and zero the stored
// (fp16-rounded) values as floats.
KVQ_HD inline uint8_t quant_code(float xc, float scale, float zero, float levels) {
  const float c = exact::floor(exact::add(exact::add(exact::div(xc, scale), zero), 0.5f));
  return uint8_t(c < 0.f ? 0.f : (levels < c ? levels : c));
}
// x̂ = (code - zero) · scale, scale and zero as floats.
KVQ_HD inline float dequant(float code, float scale, float zero) { return (code - zero) * scale; }

KVQ_HD inline float dequant_value(uint8_t code, fp16_t scale, fp16_t zero) {
  return dequant(float(code), fp16_to_f32(scale), fp16_to_f32(zero));
}

}  // namespace kvq
