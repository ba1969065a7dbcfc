// The INT-b group quantizer of METHODS.md §1 (OSCAR / OptR grid): the single definition shared by the
// cache codecs (int8/int4/int2, KIVI) and by calibration's straight-through quantizer.
//
// For one group x[0..n):
//   thr   = |x| sorted ascending at index min(floor(clip * n), n - 1);   x_c = clamp(x, -thr, thr)
//   scale = (max(x_c) - min(x_c)) / (2^bits - 1),  zero = -min(x_c) / scale   (both rounded to fp16, stored)
//   code  = clamp(floor(x_c / scale + zero + 0.5), 0, 2^bits - 1)            (uses the fp16-rounded values)
//   x̂     = (code - zero) * scale
// Degenerate groups (max == min, or a range too small for an fp16 scale) store scale = |min|, zero = -sign(min)
// and code 0, so x̂ = min exactly whenever min is representable in fp16.
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

// Quantize one group of n values; writes one code per byte into codes[0..n).
GroupQuant quantize_group(const float* x, int n, int bits, float clip, uint8_t* codes);

inline float dequant_value(uint8_t code, fp16_t scale, fp16_t zero) {
  return (float(code) - fp16_to_f32(zero)) * fp16_to_f32(scale);
}

}  // namespace kvq
