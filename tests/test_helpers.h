// Small helpers shared by several test files.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "model/config.h"

namespace kvq::test {

// The RoPE inverse frequencies (ModelConfig::rope_inv_freq, default RoPE of base theta) of head_dim d: what the runner
// puts in CacheConfig::key_rope for key codecs that store keys without RoPE.
inline std::vector<float> rope_inv_freq(int d, double theta = 10000.0) {
  ModelConfig mc;
  mc.head_dim = d;
  mc.rope.theta = theta;
  return mc.rope_inv_freq();
}

// A random orthogonal d×d matrix (Gram–Schmidt of a Gaussian matrix, in double), row-major.
inline std::vector<float> random_orthogonal(int d, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> m(size_t(d) * d);
  for (auto& x : m) x = nd(rng);
  for (int i = 0; i < d; ++i) {
    double* r = m.data() + size_t(i) * d;
    for (int j = 0; j < i; ++j) {
      const double* o = m.data() + size_t(j) * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += r[c] * o[c];
      for (int c = 0; c < d; ++c) r[c] -= dot * o[c];
    }
    double norm = 0;
    for (int c = 0; c < d; ++c) norm += r[c] * r[c];
    for (int c = 0; c < d; ++c) r[c] /= std::sqrt(norm);
  }
  return std::vector<float>(m.begin(), m.end());
}

}  // namespace kvq::test
