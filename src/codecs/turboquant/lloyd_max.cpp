#include "codecs/turboquant/lloyd_max.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <utility>

#include "common/error.h"

namespace kvq {

namespace {

constexpr int kMaxIterations = 200;
constexpr double kTolerance = 1e-10;
constexpr int kTrapezoidIntervals = 200;
constexpr double kInitRange = 3.5;  // σ: the initial centroids fill [-3.5σ, 3.5σ]
constexpr double kEdgeRange = 3.0;  // × the initial range: the outer cell edges at ±10.5σ

// ∫_a^b f by the trapezoid rule over n equal intervals, summed in vLLM's order (ends halved, then the interior).
template <class F>
double trapezoid(F f, double a, double b, int n) {
  const double h = (b - a) / n;
  double sum = 0.5 * (f(a) + f(b));
  for (int i = 1; i < n; ++i) sum += f(a + i * h);
  return sum * h;
}

}  // namespace

LloydMaxCodebook solve_lloyd_max(int head_dim, int bits) {
  KVQ_CHECK(head_dim >= 1 && bits >= 1 && bits <= 8, "Lloyd-Max codebook: head_dim {} bits {} (bits 1..8)", head_dim,
            bits);
  const int n = 1 << bits;
  const double var = 1.0 / head_dim, sigma = std::sqrt(var);
  const double norm = 1.0 / std::sqrt(2 * std::numbers::pi * var);
  const auto pdf = [&](double x) { return norm * std::exp(-x * x / (2 * var)); };
  const auto x_pdf = [&](double x) { return x * pdf(x); };
  const double lo = -kInitRange * sigma, hi = kInitRange * sigma;
  std::vector<double> c(static_cast<size_t>(n)), next(c.size()), edges(c.size() + 1);
  for (int i = 0; i < n; ++i) c[size_t(i)] = lo + (hi - lo) * (i + 0.5) / n;

  LloydMaxCodebook out;
  out.head_dim = head_dim;
  out.bits = bits;
  for (int it = 0; it < kMaxIterations; ++it) {
    edges.front() = lo * kEdgeRange;
    edges.back() = hi * kEdgeRange;
    for (int i = 0; i + 1 < n; ++i) edges[size_t(i) + 1] = (c[size_t(i)] + c[size_t(i) + 1]) / 2.0;
    double moved = 0;
    for (int i = 0; i < n; ++i) {
      const double a = edges[size_t(i)], b = edges[size_t(i) + 1];
      const double num = trapezoid(x_pdf, a, b, kTrapezoidIntervals), den = trapezoid(pdf, a, b, kTrapezoidIntervals);
      next[size_t(i)] = den > 1e-15 ? num / den : c[size_t(i)];
      moved = std::max(moved, std::abs(next[size_t(i)] - c[size_t(i)]));
    }
    if (moved < kTolerance) {  // converged: the current centroids stand (the update is not taken)
      out.converged = true;
      break;
    }
    c.swap(next);
    out.iterations = it + 1;
  }
  for (double x : c) out.centroids.push_back(float(x));
  for (int i = 0; i + 1 < n; ++i)
    out.midpoints.push_back((out.centroids[size_t(i)] + out.centroids[size_t(i) + 1]) / 2.f);
  return out;
}

const LloydMaxCodebook& lloyd_max_codebook(int head_dim, int bits) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<const LloydMaxCodebook>> memo;
  const std::lock_guard<std::mutex> lock(mu);
  auto& slot = memo[{head_dim, bits}];
  if (!slot) slot = std::make_unique<const LloydMaxCodebook>(solve_lloyd_max(head_dim, bits));
  return *slot;
}

}  // namespace kvq
