#include "eval/perplexity.h"

#include <chrono>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace kvq {

double PerplexityResult::nll() const {
  return std::accumulate(window_nll.begin(), window_nll.end(), 0.0) / double(std::max<int64_t>(1, tokens_scored));
}

double token_nll(const float* logits, int vocab, int32_t target) {
  double mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return mx + std::log(sum) - double(logits[target]);
}

int scored_targets(int ctx, int prompt_tokens) {
  KVQ_CHECK(prompt_tokens >= 0 && prompt_tokens < ctx,
            "prompt of {} tokens does not fit a window of {} (need 0 <= prompt < ctx: at least one scored target)",
            prompt_tokens, ctx);
  return ctx - std::max(prompt_tokens, 1);
}

void check_tail(int ctx, int prompt_tokens, int tail) {
  KVQ_CHECK(tail == 0 || (tail >= prompt_tokens && tail < ctx),
            "a tail from position {} of windows of {} with a prompt of {} (need prompt <= tail < ctx, or 0: none)",
            tail, ctx, prompt_tokens);
}

void forward_span(Runner& runner, int seq, const int32_t* win, int pos, int end, std::vector<float>& logits,
                  const std::function<void(int, const float*)>& row) {
  const int V = runner.config().vocab_size, chunk = runner.cache_config().max_chunk;
  logits.resize(size_t(chunk) * V);
  for (; pos < end; pos += chunk) {
    const int n = std::min(chunk, end - pos);
    runner.forward(seq, win + pos, n, logits.data(), true);
    for (int i = 0; i < n; ++i) row(pos + i, logits.data() + size_t(i) * V);
  }
}

PerplexityResult perplexity(Runner& runner, const std::vector<int32_t>& ids, int ctx, int windows,
                            const std::function<void(int, int, double)>& progress, int prompt_tokens, int tail) {
  const ModelConfig& mc = runner.config();
  KVQ_CHECK(ctx >= 2, "perplexity: context {} is too short (need >= 2)", ctx);
  KVQ_CHECK(ctx <= mc.max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx, mc.max_ctx);
  KVQ_CHECK(ctx <= runner.max_ctx(), "perplexity: context {} exceeds the cache's {} tokens", ctx, runner.max_ctx());
  const int available = int(ids.size() / size_t(ctx));
  KVQ_CHECK(available >= 1, "the text has {} tokens, fewer than one window of {}", ids.size(), ctx);
  const int n_windows = windows > 0 ? std::min(windows, available) : available;
  const int V = mc.vocab_size, P = prompt_tokens;
  const int scored = scored_targets(ctx, P), first = first_scored_row(P);
  check_tail(ctx, P, tail);

  PerplexityResult res;
  res.ctx = ctx;
  res.prompt_tokens = P;
  res.tail_prompt_tokens = tail;
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    const int32_t* win = ids.data() + size_t(w) * ctx;
    const int seq = runner.new_sequence();
    double nll = 0, nll_tail = 0;
    const auto score = [&](int i, const float* row) {
      if (i < first || i + 1 >= ctx) return;
      const double x = token_nll(row, V, win[i + 1]);
      nll += x;
      if (tail > 0 && i >= first_scored_row(tail)) nll_tail += x;
    };
    forward_span(runner, seq, win, 0, P, logits, score);  // the prompt
    runner.end_prompt(seq);
    forward_span(runner, seq, win, P, ctx, logits, score);  // teacher-forced after it
    runner.free_sequence(seq);
    res.window_nll.push_back(nll);
    if (tail > 0) res.window_nll_tail.push_back(nll_tail);
    res.tokens_scored += scored;
    if (progress) progress(w + 1, n_windows, res.ppl());
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

PerplexityResult perplexity(Model& model, const CacheConfig& cache_cfg, const std::vector<int32_t>& ids, int ctx,
                            int windows, const std::function<void(int, int, double)>& progress, int prompt_tokens,
                            int tail) {
  KVQ_CHECK(ctx >= 2, "perplexity: context {} is too short (need >= 2)", ctx);
  KVQ_CHECK(ctx <= model.config().max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx,
            model.config().max_ctx);
  CpuRunner runner(model, cache_cfg, ctx);
  return perplexity(runner, ids, ctx, windows, progress, prompt_tokens, tail);
}

}  // namespace kvq
