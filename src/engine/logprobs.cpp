#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvq {

GeneratedToken token_logprobs(const float* logits, int vocab, int32_t chosen, int top) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  GeneratedToken t;
  t.id = chosen;
  t.logprob = float(double(logits[chosen]) - lse);
  const int k = std::min(std::max(top, 0), vocab);
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; ++i) t.top.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - lse)});
  }
  return t;
}

}  // namespace kvq
