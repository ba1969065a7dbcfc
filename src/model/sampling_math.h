// The sampler's floating-point arithmetic, the same bits on the host and the GPU: IEEE double operations each rounded
// once (common/hd.h's exact::dadd, dmul, ddiv), and the logarithm and exponential written from them alone, so that no
// libm's last bit decides a token. Used by the Gumbel-max draw (model/gumbel.h) and by the probabilities a top_p /
// min_p draw sums (model/sampler.h), which the GPU computes for a row where its logits are. Plain header (KVQ_HD),
// includable from .cu files.
#pragma once

#include <stdint.h>

#include <cmath>

#include "common/hd.h"

namespace kvq {

// The most candidates the sampler sorts whole (a top_k up to it, or a top_p / min_p nucleus from that many of a row's
// largest logits: model/sampler.h), and so the most the GPU selects for it (cuda/gpu_model_kernels.h: top_k_rows).
inline constexpr int kMaxSortedTopK = 1024;

}  // namespace kvq

namespace kvq::smath {

using exact::dadd, exact::dmul, exact::ddiv;

// log(x) for finite x > 0, as fdlibm arranges it: x = (1 + f) 2^e with 1 + f in [sqrt(1/2), sqrt(2)), s = f / (2 + f),
// log(1 + f) = 2s + s R with R = 2 s^2 / 3 + 2 s^4 / 5 + ... (an odd series, Horner form, |s| <= 0.1716: the next term
// is below 2^-60 relative), written f - s (f - R) so that the rounding of the small correction s (f - R) stays small;
// e ln 2 in two parts (ln2_hi's low 32 bits are zero: e ln2_hi is exact).
KVQ_HD inline double log_exact(double x) {
  int e = 0;
  double m = frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < 0.70710678118654752440) m = dmul(m, 2.0), --e;  // exact
  const double f = dadd(m, -1.0), s = ddiv(f, dadd(2.0, f)), z = dmul(s, s);
  // 2 / k for k = 3, 5, ..., 25, correctly rounded (the values ddiv(2.0, k) gives)
  constexpr double kTwoOver[] = {0x1.5555555555555p-1, 0x1.999999999999ap-2, 0x1.2492492492492p-2,
                                 0x1.c71c71c71c71cp-3, 0x1.745d1745d1746p-3, 0x1.3b13b13b13b14p-3,
                                 0x1.1111111111111p-3, 0x1.e1e1e1e1e1e1ep-4, 0x1.af286bca1af28p-4,
                                 0x1.8618618618618p-4, 0x1.642c8590b2164p-4, 0x1.47ae147ae147bp-4};
  double r = kTwoOver[11];
  for (int j = 10; j >= 0; --j) r = dadd(dmul(r, z), kTwoOver[j]);
  r = dmul(r, z);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double lo = dadd(dmul(double(e), kLn2Lo), dadd(f, -dmul(s, dadd(f, -r))));
  return dadd(dmul(double(e), kLn2Hi), lo);
}

// exp(x) for x <= 0: x = k ln 2 + r with k = round(x / ln 2) and |r| <= ln 2 / 2 (k ln2_hi exact, as in log_exact),
// exp(r) by its Taylor series to r^15 / 15! in Horner form (the next term is below 2^-60 relative), times 2^k (exact:
// the result stays normal). x below -700 gives 0 (exp(-700) ~ 1e-304: a probability nothing can draw).
KVQ_HD inline double exp_exact(double x) {
  if (!(x >= -700.0)) return 0.0;
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
#if defined(__CUDA_ARCH__)
  const double k = rint(ddiv(x, 0.69314718055994530942));
#else
  const double k = std::nearbyint(ddiv(x, 0.69314718055994530942));
#endif
  const double r = dadd(dadd(x, -dmul(k, kLn2Hi)), -dmul(k, kLn2Lo));
  // 1 / n! for n = 0 .. 15, correctly rounded (the values ddiv(1.0, n!) gives)
  constexpr double kInvFact[] = {0x1.0000000000000p+0, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
                                 0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7,
                                 0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16,
                                 0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26,
                                 0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33, 0x1.93974a8c07c9dp-37,
                                 0x1.ae7f3e733b81fp-41};
  double p = kInvFact[15];
  for (int n = 14; n >= 0; --n) p = dadd(dmul(p, r), kInvFact[n]);
  return ldexp(p, int(k));
}

// The unnormalised probability of a logit at temperature T > 0 against the row's largest mx: exp((logit - mx) / T).
KVQ_HD inline double weight(float logit, float mx, double temperature) {
  return exp_exact(ddiv(double(exact::sub(logit, mx)), temperature));
}

// The order of a sum over n probabilities: kSumBlocks contiguous blocks of sum_block(n) terms, each summed in order,
// then the blocks' sums in order (for n <= kSumBlocks: one term a block, the plain sum in order). The GPU sums a row
// the same way, a thread a block.
inline constexpr int kSumBlocks = 1024;
KVQ_HD inline int64_t sum_block(int64_t n) { return (n + kSumBlocks - 1) / kSumBlocks; }

// What the GPU returns with a row's largest logits for a top_p / min_p draw over the whole vocabulary: the sum of
// every token's weight (in the order above) and how many weigh at least min_p.
struct RowMass {
  double total;
  int64_t above_min_p;
};
// A row's temperature (> 0) and min_p for its RowMass.
struct MassQuery {
  double temperature;
  double min_p;
};

}  // namespace kvq::smath
