// Sampling at a temperature by the Gumbel-max trick, the same bits on the host and the GPU: the token drawn from
// softmax(logits / T) is argmax_i (logit_i / T + G_i), with G_i = -log(-log u_i) standard Gumbel noise and u_i a
// uniform in (0, 1) that is a pure function of (seed, draw, i) — counter-based (splitmix64, model/dummy_weights.h), so
// a GPU block draws row i's noise without the host's generator, and the host draws the same. One pass over the row:
// no sort, no sum over the vocabulary.
//
// Bit-identical on both sides: the uniform is integer arithmetic; the logarithm is written here (frexp, then
// log(m) = 2 atanh((m - 1) / (m + 1)) as an odd series in Horner form) from the IEEE double operations alone, each
// rounded once (the __d*_rn intrinsics on the device, never fused; plain operators on the baseline x86-64 host), so no
// libm's last bit decides a token. Its error is within 1 ulp of libm's log over the doubles the noise takes (tested).
// Plain header (KVQ_HD), includable from .cu files.
#pragma once

#include <stdint.h>

#include <cmath>

#include "common/hd.h"
#include "model/dummy_weights.h"  // splitmix64

namespace kvq::gumbel {

// One row's draw: its noise (draw_base) and temperature (> 0).
struct Draw {
  uint64_t base;
  double temperature;
};

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

// log(x) for finite x > 0, as fdlibm arranges it: x = (1 + f) 2^e with 1 + f in [sqrt(1/2), sqrt(2)), s = f / (2 + f),
// log(1 + f) = 2s + s R with R = 2 s^2 / 3 + 2 s^4 / 5 + ... (an odd series, Horner form, |s| <= 0.1716: the next term
// is below 2^-60 relative), written f - s (f - R) so that the rounding of the small correction s (f - R) stays small;
// e ln 2 in two parts (ln2_hi's low 32 bits are zero: e ln2_hi is exact).
KVQ_HD inline double log_exact(double x) {
  int e = 0;
  double m = frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < 0.70710678118654752440) m = dmul(m, 2.0), --e;  // exact
  const double f = dadd(m, -1.0), s = ddiv(f, dadd(2.0, f)), z = dmul(s, s);
  double r = ddiv(2.0, 25.0);
  for (int k = 23; k >= 3; k -= 2) r = dadd(dmul(r, z), ddiv(2.0, double(k)));
  r = dmul(r, z);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double lo = dadd(dmul(double(e), kLn2Lo), dadd(f, -dmul(s, dadd(f, -r))));
  return dadd(dmul(double(e), kLn2Hi), lo);
}

// The counter origin of draw `draw` of a sampler seeded `seed`.
KVQ_HD inline uint64_t draw_base(uint64_t seed, uint64_t draw) {
  return splitmix64(splitmix64(seed ^ 0x6a09e667f3bcc909ull) + draw);
}

// u_i in (0, 1): 53 random bits and a half, times 2^-53 (exact).
KVQ_HD inline double uniform(uint64_t base, uint64_t i) {
  return dmul(dadd(double(splitmix64(base + i) >> 11), 0.5), 1.0 / 9007199254740992.0);  // 2^-53: exact
}

// logit / T + G_i: token i's score in the draw (T > 0; the token with the largest score, the lowest id on ties, is
// drawn).
KVQ_HD inline double score(float logit, double temperature, uint64_t base, uint64_t i) {
  const double g = -log_exact(-log_exact(uniform(base, i)));
  return dadd(ddiv(double(logit), temperature), g);
}

}  // namespace kvq::gumbel
