// The CPU linear layer (model/linear.h): the bf16 decode path against a float64 reference on the same fp32 weights,
// and which path each kind of weight takes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/half.h"
#include "model/linear.h"

namespace kvq {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, bool bf16_exact) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_exact ? bf16_to_f32(f32_to_bf16(nd(rng))) : nd(rng);
  return v;
}

// y = x Wᵀ + b in float64.
std::vector<double> reference(const std::vector<float>& x, int n, const std::vector<float>& w, int out, int in,
                              const std::vector<float>& bias) {
  std::vector<double> y(size_t(n) * out);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[size_t(o)];
      for (int c = 0; c < in; ++c) s += double(x[size_t(i) * in + c]) * w[size_t(o) * in + c];
      y[size_t(i) * out + o] = s;
    }
  return y;
}

void expect_close(const std::vector<float>& y, const std::vector<double>& ref, int in) {
  // fp32 dot products of `in` terms of unit-variance products: the error grows like sqrt(in) ulps of the sum.
  const double tol = 1e-5 * std::sqrt(double(in));
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], tol * (1 + std::abs(ref[i]))) << "at " << i;
}

TEST(Linear, Bf16DecodePathMatchesTheReference) {
  ThreadPool pool(2);
  for (int in : {32, 384, 1280}) {
    const int out = 200;  // not a multiple of the 64-row work items
    const auto w = random_vec(size_t(out) * in, 1, true), bias = random_vec(size_t(out), 2, false);
    const Linear lin(w, out, in, bias);
    EXPECT_TRUE(lin.reads_bf16());
    EXPECT_EQ(lin.decode_bytes(), size_t(out) * in * 2);
    for (int n : {1, 3, Linear::kGemvRows, Linear::kGemvRows + 1}) {  // the last one runs sgemm
      const auto x = random_vec(size_t(n) * in, 3 + n, false);
      std::vector<float> y(size_t(n) * out);
      lin.apply(x.data(), n, y.data(), pool);
      expect_close(y, reference(x, n, w, out, in, bias), in);
    }
  }
}

TEST(Linear, WeightsThatAreNotBf16StayOnTheFp32Path) {
  ThreadPool pool(2);
  const int out = 70, in = 96;
  const auto w = random_vec(size_t(out) * in, 4, false);
  const Linear lin(w, out, in);
  EXPECT_FALSE(lin.reads_bf16());
  EXPECT_EQ(lin.decode_bytes(), size_t(out) * in * 4);
  for (int n : {1, 5}) {
    const auto x = random_vec(size_t(n) * in, 5, false);
    std::vector<float> y(size_t(n) * out);
    lin.apply(x.data(), n, y.data(), pool);
    expect_close(y, reference(x, n, w, out, in, {}), in);
  }
  // A row width the row kernels cannot read (not a multiple of 32) keeps fp32 even for bf16 weights.
  const auto w2 = random_vec(size_t(out) * 40, 6, true);
  EXPECT_FALSE(Linear(w2, out, 40).reads_bf16());
}

}  // namespace
}  // namespace kvq
