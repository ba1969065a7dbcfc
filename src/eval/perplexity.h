// Perplexity over non-overlapping windows of ctx tokens, decode-faithful (docs/guide/methods.md §2): each window is a
// fresh sequence prefilled in chunks through the configured KV cache, and every position but the window's first is
// scored against the next token.
//
// With a prompt of P > 0 tokens per window (the "as shipped" rows, METHODS §5): tokens [0, P) are the prompt, prefilled
// in chunks of max_chunk; then Runner::end_prompt applies the cache's prompt policy (CacheConfig::prompt_policy); then
// tokens [P, ctx) are teacher-forced in chunks (the cache reads decode-faithfully after the prompt), and only the
// targets at positions >= P are scored: ctx - P per window. P = 0 is the plain decode-faithful scoring (ctx - 1
// targets; end_prompt is still called before the first token, which a decode-faithful cache ignores). A tail T (P <= T
// < ctx, 0: none) also sums each window's NLL over its targets at positions >= T, from the same pass: the referee pairs
// a run with one of a longer prompt (its eviction row) on the targets both scored.
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
  int64_t tokens_scored = 0;       // scored_targets(ctx, P) per window
  int ctx = 0;                     // window length
  int prompt_tokens = 0;           // P: the prompt of each window (targets at positions < P are not scored)
  int tail_prompt_tokens = 0;      // T: the tail's start (0: no tail)
  std::vector<double> window_nll_tail;  // summed NLL of each window's targets at positions >= T (empty: no tail)
  double seconds = 0;              // wall time of the forward passes
  double nll() const;              // mean NLL per scored token
  double ppl() const { return std::exp(nll()); }
};

// Targets scored in a window of ctx tokens with a prompt of P: ctx - max(P, 1). kvq::Error unless 0 <= P < ctx.
int scored_targets(int ctx, int prompt_tokens);
// The first logit row of a window that is scored (it predicts the token at position P): max(P - 1, 0).
inline int first_scored_row(int prompt_tokens) { return prompt_tokens > 0 ? prompt_tokens - 1 : 0; }

// windows <= 0: every full window of ids. progress(done, total, running ppl) after each window. prompt_tokens: P above;
// tail_prompt_tokens: T above. On any device: runner.max_ctx() >= ctx; each window is one sequence, freed after it.
PerplexityResult perplexity(Runner& runner, const std::vector<int32_t>& ids, int ctx, int windows,
                            const std::function<void(int, int, double)>& progress = {}, int prompt_tokens = 0,
                            int tail_prompt_tokens = 0);
// The CPU path: a CpuRunner over model with a fresh cache of cache_cfg.
PerplexityResult perplexity(Model& model, const CacheConfig& cache_cfg, const std::vector<int32_t>& ids, int ctx,
                            int windows, const std::function<void(int, int, double)>& progress = {},
                            int prompt_tokens = 0, int tail_prompt_tokens = 0);

// Forwards tokens [pos, end) of a window to seq in chunks of the runner's max_chunk, with every row's logits; after
// each chunk, row(i, logits of row i) for the chunk's window positions i. The one chunking loop of the scorers.
void forward_span(Runner& runner, int seq, const int32_t* win, int pos, int end, std::vector<float>& logits,
                  const std::function<void(int, const float*)>& row);

// kvq::Error unless a tail T of windows of ctx tokens with a prompt of P is 0 (none) or P <= T < ctx.
void check_tail(int ctx, int prompt_tokens, int tail_prompt_tokens);

// Negative log-likelihood (nats) of target under softmax(logits[0..vocab)), computed in double.
double token_nll(const float* logits, int vocab, int32_t target);

}  // namespace kvq
