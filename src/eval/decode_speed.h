// Single-stream decode speed through any runner (the referee's cost column at the evaluated model): one sequence
// prefilled with ctx random tokens (untimed), then warmup untimed and steps timed greedy decode steps, each feeding
// back its argmax, as a chat's generation runs after its prompt. Each timed step is synchronized and the median step
// is the figure (a busy host's stray slow step does not move it).
#pragma once

#include <cstdint>

#include "model/runner.h"

namespace kvq {

struct DecodeSpeed {
  int ctx = 0, steps = 0;  // tokens in the cache when timing starts, timed steps
  double median_s = 0;     // the median timed step
  double tokens_per_second() const { return median_s > 0 ? 1.0 / median_s : 0; }
  double ms_per_step() const { return 1e3 * median_s; }
};

// r must hold a sequence of ctx + warmup + steps tokens; ids drawn from seed. kvq::Error from the runner propagates.
DecodeSpeed time_decode(Runner& r, int ctx, int steps, int warmup = 2, uint64_t seed = 0);

}  // namespace kvq
