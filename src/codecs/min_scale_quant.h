// The min / scale quantizer of Kitty's pages (docs/guide/methods.md §5.5) and TurboQuant's values (§5.2): asymmetric,
// stored as fp16 scale and fp16 min (not the integer-offset zero of the §1 grid in codecs/group_quant.h). The two
// formats differ only in the least scale eps (Kitty 1e-6, TurboQuant 1e-8). Plain C++ (KVQ_HD, exact:: operations of
// common/hd.h: never fused), so the GPU's store kernels share it.
//
// For one group of n values x[i · stride], i < n:
//   mn, mx = min, max of the group (float)
//   s      = (mx - mn) / (2^bits - 1), raised to eps unless above it (a constant group gets s = eps, code 0; a
//            non-finite group too: its codes are 0)
//   code   = clamp(floor((x - mn) / s + 0.5), 0, 2^bits - 1)   with the float s and mn, as Kitty's kernels do
//   stored   fp16(s), fp16(mn);   x̂ = code · fp16(s) + fp16(mn)
// The codes use the unrounded s and mn while decoding reads the fp16 ones: that mismatch is the format as shipped.
// Values beyond fp16's range (|x| > 65504) are not representable (Kitty holds keys in fp16).
#pragma once

#include <cstdint>

#include "common/half.h"
#include "common/hd.h"

namespace kvq {

namespace layout {
// fp16 scale and min of one min / scale group: x̂ = code · scale + min.
struct MinScale {
  uint16_t scale;  // fp16 bits
  uint16_t min;    // fp16 bits
};
static_assert(sizeof(MinScale) == 4, "MinScale is two fp16");
}  // namespace layout

// s = (mx - mn) / (2^bits - 1), floored at eps (NaN included).
KVQ_HD inline float min_scale_step(float mn, float mx, int bits, float eps) {
  const float s = exact::div(exact::sub(mx, mn), float((1 << bits) - 1));
  return s > eps ? s : eps;
}
// clamp(floor((v - mn) / s + 0.5), 0, 2^bits - 1) with the fp32 s and mn; NaN gives 0.
KVQ_HD inline uint8_t min_scale_code(float v, float mn, float s, int bits) {
  const float c = exact::floor(exact::add(exact::div(exact::sub(v, mn), s), 0.5f));
  const float top = float((1 << bits) - 1);
  return uint8_t(c >= 0.f ? (c < top ? c : top) : 0.f);
}
// x̂ = code · s + mn, s and mn the stored fp16 values as floats.
KVQ_HD inline float min_scale_value(float code, float s16, float mn16) {
  return exact::add(exact::mul(code, s16), mn16);
}

// Quantizes x[i · stride], i < n, writing one code per byte into codes[0 .. n); returns the stored parameters.
inline layout::MinScale quantize_min_scale(const float* x, int n, int stride, int bits, float eps, uint8_t* codes) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    const float v = x[size_t(i) * stride];
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  const float s = min_scale_step(mn, mx, bits, eps);
  for (int i = 0; i < n; ++i) codes[i] = min_scale_code(x[size_t(i) * stride], mn, s, bits);
  return {f32_to_fp16(s), f32_to_fp16(mn)};
}

// x̂ = code · scale + min from the stored fp16 parameters.
inline float min_scale_dequant(uint8_t code, layout::MinScale p) {
  return min_scale_value(float(code), fp16_to_f32(p.scale), fp16_to_f32(p.min));
}

}  // namespace kvq
