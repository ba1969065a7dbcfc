// Lockstep fidelity pass (docs/METHODS.md §8): the BF16-cache run and the method's run over the same tokens in the same
// process, chunk by chunk — forward the BF16 chunk, forward the method chunk, compare the two [chunk, vocab] logit
// blocks, accumulate — so at most one chunk of logits per run is held. Both runs are decode-faithful (the method's
// cache is read as decode would hold it). With layers, a third run (the method cache fed the BF16 run's layer
// inputs) gives each layer's own attention-output error (eval/layer_errors.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "eval/layer_errors.h"
#include "common/thread_pool.h"
#include "kv/cache.h"
#include "model/runner.h"

namespace kvq {

struct WindowFidelity {
  double kl_sum = 0;        // Σ_t KL(p_bf16,t ‖ p_method,t) in nats over the window's positions
  int64_t top1_agree = 0;   // positions whose argmax agrees
  int64_t tokens = 0;       // positions compared (= ctx)
  double nll_ref = 0;       // summed NLL of the next token, BF16 run (ctx - 1 positions)
  double nll_method = 0;    // the same, method run
  int64_t nll_tokens = 0;   // ctx - 1
};

struct FidelityResult {
  int ctx = 0;                          // window length
  std::vector<WindowFidelity> windows;  // one per window, in text order
  LayerErrorSums layers;                // per-layer sums (empty unless requested)
  double seconds = 0;                   // wall time
};

// The reference cache of the comparison: BF16 keys, values and windows, with the method's chunk and page sizes.
CacheConfig bf16_reference_cache(const CacheConfig& method);

// The runners of one lockstep pass, on any device: the BF16 reference (bf16_reference_cache, no transform), the
// method (its cache and transform) and, for per-layer errors, a second method runner fed the reference's layer
// inputs (null: no layers). Each must hold a sequence of ctx tokens.
struct LockstepRunners {
  Runner* ref = nullptr;
  Runner* method = nullptr;
  Runner* forced = nullptr;
};

// Non-overlapping windows of ctx tokens from ids (windows <= 0: all full windows). The per-token comparisons run
// on pool's threads (null: the calling thread). progress(done_windows, total_windows).
FidelityResult lockstep_fidelity(const LockstepRunners& runners, const std::vector<int32_t>& ids, int ctx, int windows,
                                 ThreadPool* pool = nullptr, const std::function<void(int, int)>& progress = {});

}  // namespace kvq
