#include "kv/evict.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "codecs/float_dot.h"
#include "common/error.h"

namespace kvq {

int evict_budget(double bits, int row_bits, int prompt_tokens, int at_ctx) {
  KVQ_CHECK(bits > 0 && bits <= row_bits,
            "evict: --evict-bits {} must be in (0, {}] (the bits per element of a kept row)", bits, row_bits);
  KVQ_CHECK(prompt_tokens >= 0 && at_ctx >= 0, "evict: prompt of {} tokens, budget at context {}", prompt_tokens,
            at_ctx);
  const int n = at_ctx > 0 ? at_ctx : prompt_tokens;
  KVQ_CHECK(prompt_tokens <= n,
            "evict: the budget is stated at context {} (--evict-ctx), shorter than the prompt of {} tokens", n,
            prompt_tokens);
  // The slack keeps a product that is an integer in exact arithmetic (b_eff · N / 16 of a quantized row) that integer.
  const int64_t total = int64_t(std::floor(bits * double(n) / double(row_bits) + 1e-9));
  const int64_t after = n - prompt_tokens;  // every token after the prompt is kept
  KVQ_CHECK(total >= after,
            "evict: {} bits per element at context {} hold {} tokens' rows, fewer than the {} tokens after the prompt "
            "of {} (all kept): a longer prompt or more bits", bits, n, total, after, prompt_tokens);
  return int(std::min<int64_t>(prompt_tokens, total - after));
}

void evict_check_windows(int budget, int sink, int recent, int prompt_tokens) {
  const int P = prompt_tokens, n_sink = std::min(sink, P), r0 = std::max(n_sink, P - recent);
  KVQ_CHECK(budget >= n_sink + (P - r0),
            "evict: the budget of {} of the prompt's {} tokens cannot hold its {} sinks and {} recent tokens (a larger "
            "--evict-bits, a longer prompt or smaller --kv-sink / --kv-recent)", budget, P, n_sink, P - r0);
}

int evict_kept(double bits, int row_bits, int prompt_tokens, int at_ctx, int sink, int recent) {
  const int kept = evict_budget(bits, row_bits, prompt_tokens, at_ctx);
  evict_check_windows(kept, sink, recent, prompt_tokens);
  return kept;
}

std::vector<double> evict_scores(const float* keys, const float* values, int n_tokens, int d, const float* queries,
                                 const int* q_pos, int n_q, int group) {
  KVQ_CHECK(d % 8 == 0, "evict: head_dim {} is not a multiple of 8", d);
  const size_t n_all = static_cast<size_t>(n_tokens);
  std::vector<double> score(n_all, 0.0), p(n_all);
  std::vector<float> o(static_cast<size_t>(d));
  for (int i = 0; i < n_q; ++i) {
    const int n = q_pos[i] + 1;
    KVQ_CHECK(q_pos[i] >= 0 && n <= n_tokens, "evict: query at {} outside the {} prompt tokens", q_pos[i], n_tokens);
    for (int j = 0; j < group; ++j) {
      const float* q = queries + (size_t(i) * group + j) * d;
      double mx = -INFINITY;
      for (int t = 0; t < n; ++t) mx = std::max(mx, p[size_t(t)] = double(dot8(q, keys + size_t(t) * d, d)));
      double sum = 0;
      for (int t = 0; t < n; ++t) sum += (p[size_t(t)] = std::exp(p[size_t(t)] - mx));
      std::fill(o.begin(), o.end(), 0.f);
      for (int t = 0; t < n; ++t) axpy8(float(p[size_t(t)] /= sum), values + size_t(t) * d, o.data(), d);
      const double norm = std::sqrt(double(dot8(o.data(), o.data(), d)));
      if (!(norm > 0)) continue;  // a zero output points nowhere
      for (int t = 0; t < n; ++t)
        score[size_t(t)] += p[size_t(t)] * double(dot8(values + size_t(t) * d, o.data(), d)) / norm;
    }
  }
  return score;
}

std::vector<int> evict_keep(const std::vector<double>& score, int sink, int recent, int budget) {
  const int P = int(score.size());
  evict_check_windows(budget, sink, recent, P);
  const int n_sink = std::min(sink, P), r0 = std::max(n_sink, P - recent);
  const int extra = budget - n_sink - (P - r0);
  std::vector<int> middle(static_cast<size_t>(r0 - n_sink));
  std::iota(middle.begin(), middle.end(), n_sink);
  const int take = std::min(extra, int(middle.size()));
  std::partial_sort(middle.begin(), middle.begin() + take, middle.end(), [&](int a, int b) {
    return score[size_t(a)] != score[size_t(b)] ? score[size_t(a)] > score[size_t(b)] : a < b;
  });
  std::vector<int> keep(static_cast<size_t>(n_sink));
  std::iota(keep.begin(), keep.end(), 0);
  keep.insert(keep.end(), middle.begin(), middle.begin() + take);
  for (int t = r0; t < P; ++t) keep.push_back(t);
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace kvq
