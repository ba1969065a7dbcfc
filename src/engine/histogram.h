// A latency histogram with fixed bucket bounds (Prometheus: cumulative counts per upper bound, sum, count).
#pragma once

#include <cstdint>
#include <vector>

namespace kvq {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, increasing (seconds); +Inf is implicit
  std::vector<uint64_t> counts;  // [bounds.size() + 1] observations per bucket (not cumulative)
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double x) {
    size_t i = 0;
    while (i < bounds.size() && x > bounds[i]) ++i;
    ++counts[i];
    sum += x;
    ++count;
  }
};

}  // namespace kvq
