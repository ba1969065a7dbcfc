#include "eval/bootstrap.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "eval/rng.h"

namespace kvq {

namespace {

// Quantile of sorted values by linear interpolation between order statistics (Hyndman & Fan type 7).
double quantile_sorted(const std::vector<double>& s, double q) {
  const double h = q * double(s.size() - 1);
  const size_t lo = size_t(std::floor(h));
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (h - double(lo)) * (s[hi] - s[lo]);
}

}  // namespace

BootstrapResult bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den, int resamples,
                                uint64_t seed, double level) {
  KVQ_CHECK(!num.empty() && num.size() == den.size(), "bootstrap: {} numerators for {} denominators", num.size(),
            den.size());
  KVQ_CHECK(resamples >= 1, "bootstrap: {} resamples", resamples);
  KVQ_CHECK(level > 0 && level < 1, "bootstrap: confidence level {} outside (0, 1)", level);
  const size_t n = num.size();
  const double den_all = std::accumulate(den.begin(), den.end(), 0.0);
  KVQ_CHECK(den_all > 0, "bootstrap: the denominators sum to {}", den_all);
  BootstrapResult r;
  r.ci.estimate = std::accumulate(num.begin(), num.end(), 0.0) / den_all;
  r.resamples = resamples;
  EvalRng rng(seed);
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (double& st : stats) {
    double a = 0, b = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t j = size_t(rng.below(n));
      a += num[j];
      b += den[j];
    }
    st = a / b;
  }
  r.boot_mean = std::accumulate(stats.begin(), stats.end(), 0.0) / double(resamples);
  std::sort(stats.begin(), stats.end());
  const double alpha = (1 - level) / 2;
  r.ci.lo = quantile_sorted(stats, alpha);
  r.ci.hi = quantile_sorted(stats, 1 - alpha);
  return r;
}

double normal_quantile_two_sided(double level) {
  KVQ_CHECK(level > 0 && level < 1, "confidence level {} outside (0, 1)", level);
  // Solve erf(z / sqrt 2) = level by bisection (monotone); 200 halvings reach double precision.
  double lo = 0, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (std::erf(mid / std::sqrt(2.0)) < level ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Interval wilson_interval(int64_t successes, int64_t trials, double level) {
  KVQ_CHECK(trials >= 1 && successes >= 0 && successes <= trials, "wilson: {} successes of {} trials", successes,
            trials);
  const double z = normal_quantile_two_sided(level), n = double(trials), p = double(successes) / n;
  const double z2n = z * z / n;
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / n + z * z / (4 * n * n));
  // At 0 (or n) successes the bound is exactly 0 (or 1) in closed form; keep rounding from moving it.
  const double lo = successes == 0 ? 0.0 : std::max(0.0, center - half);
  const double hi = successes == trials ? 1.0 : std::min(1.0, center + half);
  return Interval{p, lo, hi};
}

}  // namespace kvq
