// Sampling at a temperature by the Gumbel-max trick, the same bits on the host and the GPU: the token drawn from
// softmax(logits / T) is argmax_i (logit_i / T + G_i), with G_i = -log(-log u_i) standard Gumbel noise and u_i a
// uniform in (0, 1) that is a pure function of (seed, draw, i) — counter-based (splitmix64, model/dummy_weights.h), so
// a GPU block draws row i's noise without the host's generator, and the host draws the same. One pass over the row:
// no sort, no sum over the vocabulary.
//
// Bit-identical on both sides: the uniform is integer arithmetic, the logarithm model/sampling_math.h's (IEEE double
// operations alone), so no libm's last bit decides a token. Plain header (KVQ_HD), includable from .cu files.
#pragma once

#include <stdint.h>

#include <cmath>

#include "common/hd.h"
#include "model/dummy_weights.h"  // splitmix64
#include "model/sampling_math.h"

namespace kvq::gumbel {

// One row's draw: its noise (draw_base) and temperature (> 0).
struct Draw {
  uint64_t base;
  double temperature;
};

// The counter origin of draw `draw` of a sampler seeded `seed`.
KVQ_HD inline uint64_t draw_base(uint64_t seed, uint64_t draw) {
  return splitmix64(splitmix64(seed ^ 0x6a09e667f3bcc909ull) + draw);
}

// u_i in (0, 1): 53 random bits and a half, times 2^-53 (exact).
KVQ_HD inline double uniform(uint64_t base, uint64_t i) {
  return exact::dmul(exact::dadd(double(splitmix64(base + i) >> 11), 0.5), 0x1p-53);  // exact
}

// logit / T + G_i: token i's score in the draw (T > 0; the token with the largest score, the lowest id on ties, is
// drawn).
KVQ_HD inline double score(float logit, double temperature, uint64_t base, uint64_t i) {
  const double g = -smath::log_exact(-smath::log_exact(uniform(base, i)));
  return exact::dadd(exact::ddiv(double(logit), temperature), g);
}

}  // namespace kvq::gumbel
