// Single-stream decode speed (eval/decode_speed.h).
#include "eval/decode_speed.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/error.h"
#include "eval/passkey.h"  // prefill_argmax
#include "eval/rng.h"

namespace kvq {

DecodeSpeed time_decode(Runner& r, int ctx, int steps, int warmup, uint64_t seed) {
  KVQ_CHECK(ctx >= 1 && steps >= 1 && warmup >= 0, "time_decode: ctx {}, {} steps, {} warm-up", ctx, steps, warmup);
  KVQ_CHECK(ctx + warmup + steps <= r.max_ctx(), "time_decode: {} + {} + {} tokens exceed the runner's {}", ctx,
            warmup, steps, r.max_ctx());
  EvalRng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(ctx));
  for (int32_t& t : ids) t = int32_t(rng.below(uint64_t(r.config().vocab_size)));
  const int seq = r.new_sequence();
  DecodeSpeed d;
  d.ctx = ctx, d.steps = steps;
  try {
    int32_t next = prefill_argmax(r, seq, ids);
    auto step = [&] {
      const int32_t in = next;
      r.forward({seq}, {1}, &in, LogitRows::Last, nullptr, &next);
    };
    for (int i = 0; i < warmup; ++i) step();
    r.synchronize();
    std::vector<double> t(static_cast<size_t>(steps));
    for (double& s : t) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      r.synchronize();
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    std::nth_element(t.begin(), t.begin() + steps / 2, t.end());
    d.median_s = t[size_t(steps / 2)];
  } catch (...) {
    r.free_sequence(seq);
    throw;
  }
  r.free_sequence(seq);
  return d;
}

}  // namespace kvq
