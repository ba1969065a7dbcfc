// Straight-through INT-b quantizer: the forward is exactly the cache quantizer's dequantized values; the
// backward equals the exact gradient of the frozen-state surrogate (finite differences); clipped elements get
// no gradient; the scale term reaches only the min/max elements.
#include <random>

#include <gtest/gtest.h>

#include "calib/ste_quant.h"
#include "codecs/group_quant.h"
#include "common/error.h"

using namespace kvq;

namespace {

RowMat<double> random_rows(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  RowMat<double> x(rows, cols);
  for (int i = 0; i < x.size(); ++i) x.data()[i] = nd(rng);
  for (int r = 0; r < rows; ++r) x(r, (5 * r) % cols) *= 8.0;  // outliers, so the clip is active
  return x;
}

}  // namespace

TEST(CalibSteQuant, ForwardEqualsCacheQuantizerDequant) {
  std::mt19937 rng(1);
  const RowMat<float> x = random_rows(6, 64, rng).cast<float>();
  const SteQuantSpec spec{2, 32, 0.9f};
  RowMat<float> xhat;
  SteState<float> st;
  ste_quant_forward(x, spec, xhat, st);
  for (int r = 0; r < 6; ++r)
    for (int g = 0; g < 2; ++g) {
      uint8_t codes[32];
      const GroupQuant q = quantize_group(&x(r, 32 * g), 32, 2, 0.9f, codes);
      for (int i = 0; i < 32; ++i) ASSERT_EQ(xhat(r, 32 * g + i), dequant_value(codes[i], q.scale, q.zero));
    }
}

TEST(CalibSteQuant, SurrogateEqualsForwardAtRecordedPoint) {
  std::mt19937 rng(2);
  const RowMat<double> x = random_rows(8, 128, rng);
  RowMat<double> xhat, sur;
  SteState<double> st;
  ste_quant_forward(x, SteQuantSpec{2, 128, 0.96f}, xhat, st);
  ste_quant_surrogate(x, st, sur);
  EXPECT_LT((xhat - sur).cwiseAbs().maxCoeff(), 1e-12);
}

TEST(CalibSteQuant, BackwardMatchesFiniteDifferencesOfFrozenSurrogate) {
  // The real quantizer is piecewise constant, so the check is on the surrogate with the codes' rounding
  // residuals, the clip decisions and i_min/i_max frozen at the base point; its gradient is the STE rule.
  std::mt19937 rng(3);
  for (int bits : {2, 4})
    for (int G : {32, 64}) {
      const RowMat<double> x = random_rows(4, 64, rng);
      RowMat<double> w = random_rows(4, 64, rng), xhat, gx;
      SteState<double> st;
      ste_quant_forward(x, SteQuantSpec{bits, G, 0.9f}, xhat, st);
      ste_quant_backward(st, w, gx);
      const auto loss = [&](const RowMat<double>& xx) {
        RowMat<double> y;
        ste_quant_surrogate(xx, st, y);
        return (y.array() * w.array()).sum();
      };
      const double h = 1e-6;
      for (int i = 0; i < x.size(); ++i) {
        RowMat<double> xp = x, xm = x;
        xp.data()[i] += h, xm.data()[i] -= h;
        const double fd = (loss(xp) - loss(xm)) / (2 * h);
        ASSERT_NEAR(gx.data()[i], fd, 1e-7 * (1 + std::fabs(fd))) << "bits " << bits << " G " << G << " i " << i;
      }
    }
}

TEST(CalibSteQuant, ClippedGetZeroAndInteriorGetUpstreamGradient) {
  std::mt19937 rng(4);
  const RowMat<double> x = random_rows(3, 128, rng);
  RowMat<double> xhat, gx;
  SteState<double> st;
  ste_quant_forward(x, SteQuantSpec{2, 128, 0.9f}, xhat, st);
  RowMat<double> g = RowMat<double>::Constant(3, 128, 0.5);
  ste_quant_backward(st, g, gx);
  int n_clipped = 0;
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 128; ++c) {
      if (!st.pass[size_t(r) * 128 + c]) {
        EXPECT_EQ(gx(r, c), 0.0);
        ++n_clipped;
      } else if (c != st.i_min[r] && c != st.i_max[r]) {
        EXPECT_EQ(gx(r, c), 0.5);
      }
    }
  }
  EXPECT_GE(n_clipped, 3 * 10);  // r = 0.9 of 128 clips at least 12 per row (ties aside)
}

TEST(CalibSteQuant, DegenerateGroupPassesGradientThrough) {
  RowMat<double> x = RowMat<double>::Constant(1, 32, 0.75), xhat, gx;
  SteState<double> st;
  ste_quant_forward(x, SteQuantSpec{2, 32, 1.f}, xhat, st);
  EXPECT_EQ((xhat.array() - 0.75).abs().maxCoeff(), 0.0);
  RowMat<double> g(1, 32);
  for (int i = 0; i < 32; ++i) g(0, i) = -1.0 + i / 16.0;
  ste_quant_backward(st, g, gx);
  EXPECT_LT((gx - g).cwiseAbs().maxCoeff(), 1e-15);
}

TEST(CalibSteQuant, RejectsBadSpec) {
  RowMat<float> x = RowMat<float>::Zero(2, 96), xhat;
  SteState<float> st;
  EXPECT_THROW(ste_quant_forward(x, SteQuantSpec{2, 64, 0.9f}, xhat, st), Error);
  EXPECT_THROW(ste_quant_forward(x, SteQuantSpec{9, 32, 0.9f}, xhat, st), Error);
  EXPECT_THROW(ste_quant_forward(x, SteQuantSpec{2, 32, 0.f}, xhat, st), Error);
}
