#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace kvq {

void SamplerConfig::validate() const {
  KVQ_CHECK(temperature >= 0.f && std::isfinite(temperature), "--temp must be >= 0 (got {})", temperature);
  KVQ_CHECK(top_k >= 0, "--top-k must be >= 0 (got {})", top_k);
  KVQ_CHECK(top_p > 0.f && top_p <= 1.f, "--top-p must be in (0, 1] (got {})", top_p);
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { cfg.validate(); }

int32_t Sampler::sample(const float* logits, int vocab) {
  if (cfg_.temperature == 0.f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  cand_.resize(size_t(vocab));
  for (int i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i], i};
  const size_t k = cfg_.top_k > 0 ? std::min(size_t(cfg_.top_k), cand_.size()) : cand_.size();
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  cand_.resize(k);
  const float mx = cand_[0].first;
  double total = 0;
  for (auto& c : cand_) total += (c.first = std::exp((c.first - mx) / cfg_.temperature));
  double cum = 0;
  size_t keep = 0;
  while (keep < cand_.size()) {
    cum += cand_[keep++].first / total;
    if (cum >= cfg_.top_p) break;
  }
  cand_.resize(keep);
  std::uniform_real_distribution<double> u(0.0, cum * total);
  double r = u(rng_);
  for (const auto& c : cand_) {
    if ((r -= c.first) <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace kvq
