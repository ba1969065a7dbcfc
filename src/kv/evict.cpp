#include "kv/evict.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace kvq {

int evict_budget(double bits, int row_bits, int prompt_tokens) {
  KVQ_CHECK(bits > 0 && bits <= row_bits,
            "evict: --evict-bits {} must be in (0, {}] (the bits per element of a kept row)", bits, row_bits);
  KVQ_CHECK(prompt_tokens >= 0, "evict: prompt of {} tokens", prompt_tokens);
  const double kept = std::floor(bits * double(prompt_tokens) / double(row_bits));
  return std::min(prompt_tokens, int(kept));
}

std::vector<double> evict_scores(const float* keys, const float* values, int n_tokens, int d, const float* queries,
                                 const int* q_pos, int n_q, int group) {
  const size_t n_all = static_cast<size_t>(n_tokens);
  std::vector<double> score(n_all, 0.0), s(n_all), o(static_cast<size_t>(d));
  for (int i = 0; i < n_q; ++i) {
    const int n = q_pos[i] + 1;
    KVQ_CHECK(q_pos[i] >= 0 && n <= n_tokens, "evict: query at {} outside the {} prompt tokens", q_pos[i], n_tokens);
    for (int j = 0; j < group; ++j) {
      const float* q = queries + (size_t(i) * group + j) * d;
      double mx = -INFINITY;
      for (int t = 0; t < n; ++t) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[c]) * keys[size_t(t) * d + c];
        s[size_t(t)] = dot;
        mx = std::max(mx, dot);
      }
      double sum = 0;
      for (int t = 0; t < n; ++t) sum += (s[size_t(t)] = std::exp(s[size_t(t)] - mx));
      std::fill(o.begin(), o.end(), 0.0);
      for (int t = 0; t < n; ++t) {
        s[size_t(t)] /= sum;  // p_t
        for (int c = 0; c < d; ++c) o[size_t(c)] += s[size_t(t)] * values[size_t(t) * d + c];
      }
      const double norm = std::sqrt(std::inner_product(o.begin(), o.end(), o.begin(), 0.0));
      if (!(norm > 0)) continue;
      for (int t = 0; t < n; ++t) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += values[size_t(t) * d + c] * o[size_t(c)];
        score[size_t(t)] += s[size_t(t)] * dot / norm;
      }
    }
  }
  return score;
}

std::vector<int> evict_keep(const std::vector<double>& score, int sink, int recent, int budget) {
  const int P = int(score.size());
  const int n_sink = std::min(sink, P), r0 = std::max(n_sink, P - recent);
  const int extra = budget - n_sink - (P - r0);
  KVQ_CHECK(extra >= 0,
            "evict: the budget of {} of the prompt's {} tokens cannot hold its {} sinks and {} recent tokens (a larger "
            "--evict-bits, a longer prompt or smaller --kv-sink / --kv-recent)", budget, P, n_sink, P - r0);
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
