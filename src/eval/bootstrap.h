// Confidence intervals for evaluation metrics: percentile bootstrap over windows (or trials) and the Wilson score
// interval for a proportion.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

struct Interval {
  double estimate;  // the statistic on the full sample
  double lo, hi;    // two-sided confidence bounds
};

struct BootstrapResult {
  Interval ci;        // percentile interval, quantiles by linear interpolation of the sorted resample statistics
  double boot_mean;   // mean of the resample statistics
  int resamples;      // B
};

// Bootstrap of a ratio statistic Σ num_i / Σ den_i over units i (windows): each resample draws n units with
// replacement (EvalRng(seed)). With den_i = 1 this is the mean of num. level: e.g. 0.95. n >= 1, den sums > 0.
BootstrapResult bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den, int resamples,
                                uint64_t seed, double level = 0.95);

// Wilson score interval for successes out of trials (closed form); trials >= 1.
Interval wilson_interval(int64_t successes, int64_t trials, double level = 0.95);

// Two-sided standard normal quantile z with P(|Z| <= z) = level (0 < level < 1).
double normal_quantile_two_sided(double level);

}  // namespace kvq
