// Perplexity over non-overlapping windows of ctx tokens, decode-faithful (docs/METHODS.md §2): each window is a fresh
// sequence prefilled in chunks through the configured KV cache, and every position but the window's first is
// scored against the next token.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kv/cache.h"
#include "model/model.h"
#include "model/runner.h"

namespace kvq {

struct PerplexityResult {
  std::vector<double> window_nll;  // summed NLL (nats) of each window
  int64_t tokens_scored = 0;       // ctx - 1 per window
  int ctx = 0;                     // window length
  double seconds = 0;              // wall time of the forward passes
  double nll() const;              // mean NLL per scored token
  double ppl() const { return std::exp(nll()); }
};

// windows <= 0: every full window of ids. progress(done, total, running ppl) after each window.
// On any device: runner.max_ctx() >= ctx; each window is one sequence, freed after it.
PerplexityResult perplexity(Runner& runner, const std::vector<int32_t>& ids, int ctx, int windows,
                            const std::function<void(int, int, double)>& progress = {});
// The CPU path: a CpuRunner over model with a fresh cache of cache_cfg.
PerplexityResult perplexity(Model& model, const CacheConfig& cache_cfg, const std::vector<int32_t>& ids, int ctx,
                            int windows, const std::function<void(int, int, double)>& progress = {});

// Negative log-likelihood (nats) of target under softmax(logits[0..vocab)), computed in double.
double token_nll(const float* logits, int vocab, int32_t target);

}  // namespace kvq
