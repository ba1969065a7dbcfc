// Token sampling from logits: greedy (temperature 0) or temperature + top-k + top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvq {

struct SamplerConfig {
  float temperature = 0.8f;  // 0: greedy (argmax)
  int top_k = 40;            // keep the k most likely tokens (0: all)
  float top_p = 0.95f;       // then the smallest set with cumulative probability >= top_p (1: all)
  uint64_t seed = 0;         // RNG seed
  void validate() const;     // throws kvq::Error on out-of-range values
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  int32_t sample(const float* logits, int vocab);

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit or prob, token) scratch
};

}  // namespace kvq
