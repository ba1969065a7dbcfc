// The min / scale quantizer of Kitty's pages (docs/METHODS.md §5.5): asymmetric, stored as fp16 scale and fp16 min
// (not the integer-offset zero of the §1 grid in kv/group_quant.h). TurboQuant's values (§5.2) are the same grid with
// eps 1e-8.
//
// For one group of n values x[i · stride], i < n:
//   mn, mx = min, max of the group (float)
//   s      = (mx - mn) / (2^bits - 1), raised to eps when below it (a constant group gets s = eps, code 0)
//   code   = clamp(floor((x - mn) / s + 0.5), 0, 2^bits - 1)   with the float s and mn, as Kitty's kernels do
//   stored   fp16(s), fp16(mn);   x̂ = code · fp16(s) + fp16(mn)
// The codes use the unrounded s and mn while decoding reads the fp16 ones: that mismatch is the format as shipped.
// Values beyond fp16's range (|x| > 65504) are not representable (Kitty holds keys in fp16).
#pragma once

#include <cstdint>

#include "common/half.h"

namespace kvq {

namespace layout {
// fp16 scale and min of one min / scale group: x̂ = code · scale + min.
struct MinScale {
  uint16_t scale;  // fp16 bits
  uint16_t min;    // fp16 bits
};
static_assert(sizeof(MinScale) == 4, "MinScale is two fp16");
}  // namespace layout

// Quantizes x[i · stride], i < n, writing one code per byte into codes[0 .. n); returns the stored parameters.
inline layout::MinScale quantize_min_scale(const float* x, int n, int stride, int bits, float eps, uint8_t* codes) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    const float v = x[size_t(i) * stride];
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  const float levels = float((1 << bits) - 1);
  float s = exact::div(exact::sub(mx, mn), levels);
  if (s < eps) s = eps;
  for (int i = 0; i < n; ++i) {
    const float c = exact::floor(exact::add(exact::div(exact::sub(x[size_t(i) * stride], mn), s), 0.5f));
    codes[i] = uint8_t(!(c > 0.f) ? 0.f : (c < levels ? c : levels));  // NaN -> 0
  }
  return {f32_to_fp16(s), f32_to_fp16(mn)};
}

// x̂ = code · scale + min from the stored fp16 parameters.
inline float min_scale_dequant(uint8_t code, layout::MinScale p) {
  return exact::add(exact::mul(float(code), fp16_to_f32(p.scale)), fp16_to_f32(p.min));
}

}  // namespace kvq
