// Lockstep fidelity pass (docs/guide/methods.md §8): the BF16-cache run and the method's run over the same tokens in
// the same process, chunk by chunk — forward the BF16 chunk, forward the method chunk, compare the two [chunk, vocab]
// logit blocks, accumulate — so at most one chunk of logits per run is held. Both runs are decode-faithful (the
// method's cache is read as decode would hold it). With layers, a third run (the method cache fed the BF16 run's layer
// inputs) gives each layer's own attention-output error (eval/layer_errors.h). With a prompt of P tokens
// (eval/perplexity.h): every run prefills [0, P), calls Runner::end_prompt (the reference is decode-faithful BF16: a
// no-op there), then runs [P, ctx); KL and top-1 compare the rows that predict positions >= P (rows max(P - 1, 0) ..
// ctx - 1, the last row included as without a prompt) and the NLLs score the same targets as perplexity(); the
// per-layer errors still cover every row.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "eval/layer_errors.h"
#include "kv/cache.h"
#include "model/runner.h"

namespace kvq {

struct WindowFidelity {
  double kl_sum = 0;        // Σ_t KL(p_bf16,t ‖ p_method,t) in nats over the window's positions
  int64_t top1_agree = 0;   // positions whose argmax agrees
  int64_t tokens = 0;       // positions compared (ctx - max(P - 1, 0); = ctx without a prompt)
  double nll_ref = 0;       // summed NLL of the next token, BF16 run (scored_targets(ctx, P) positions)
  double nll_method = 0;    // the same, method run
  int64_t nll_tokens = 0;   // scored_targets(ctx, P): ctx - 1 without a prompt
  double nll_method_tail = 0;  // nll_method over the targets at positions >= the tail T (eval/perplexity.h); 0: none
  // The same tail's KL and top-1: kl_sum / top1_agree / tokens over the rows that predict positions >= T (rows
  // T - 1 .. ctx - 1, as a prompt of T compares), so every run is paired with one scored after a prompt of T on its
  // rows (the eviction row). All 0 without a tail.
  double kl_sum_tail = 0;
  int64_t top1_agree_tail = 0;
  int64_t tokens_tail = 0;
};

// One view of a window's comparison: its KL sum, top-1 agreements and rows, over the whole window or over its tail
// (the *_tail members): what the per-window bootstrap and the results' per-window arrays read.
struct FidelityFields {
  double WindowFidelity::*kl;
  int64_t WindowFidelity::*agree;
  int64_t WindowFidelity::*tokens;
};
inline constexpr FidelityFields kWholeWindow{&WindowFidelity::kl_sum, &WindowFidelity::top1_agree,
                                             &WindowFidelity::tokens};
inline constexpr FidelityFields kWindowTail{&WindowFidelity::kl_sum_tail, &WindowFidelity::top1_agree_tail,
                                            &WindowFidelity::tokens_tail};

struct FidelityResult {
  int ctx = 0;                          // window length
  int prompt_tokens = 0;                // P
  std::vector<WindowFidelity> windows;  // one per window, in text order
  LayerErrorSums layers;                // per-layer sums (empty unless requested)
  double seconds = 0;                   // wall time
};

// The reference cache of the comparison: BF16 keys, values and windows, with the method's chunk and page sizes,
// decode-faithful (whatever the method's prompt policy).
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
// on pool's threads (null: the calling thread). progress(done_windows, total_windows). tail_prompt_tokens: the tail T
// of eval/perplexity.h (0: none).
FidelityResult lockstep_fidelity(const LockstepRunners& runners, const std::vector<int32_t>& ids, int ctx, int windows,
                                 ThreadPool* pool = nullptr, const std::function<void(int, int)>& progress = {},
                                 int prompt_tokens = 0, int tail_prompt_tokens = 0);

}  // namespace kvq
