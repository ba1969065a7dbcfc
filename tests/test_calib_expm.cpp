// expm and its adjoint Fréchet derivative: exact identity at 0, orthogonality for skew arguments, agreement
// with a Taylor series, the fast skew path against the Padé/block reference, and finite differences of
// L(A) = <W, expm(A − Aᵀ)>.
#include <random>

#include <gtest/gtest.h>

#include "calib/expm.h"
#include "common/error.h"

using namespace kvq;

namespace {

Eigen::MatrixXd random_skew(int d, double frob_norm, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  Eigen::MatrixXd a(d, d);
  for (int i = 0; i < a.size(); ++i) a.data()[i] = nd(rng);
  Eigen::MatrixXd x = a - a.transpose();
  return x * (frob_norm / x.norm());
}

Eigen::MatrixXd taylor_expm(const Eigen::MatrixXd& x, int terms) {
  Eigen::MatrixXd r = Eigen::MatrixXd::Identity(x.rows(), x.cols()), t = r;
  for (int k = 1; k < terms; ++k) {
    t = (t * x / double(k)).eval();
    r += t;
  }
  return r;
}

}  // namespace

TEST(CalibExpm, ExpmOfZeroIsExactlyIdentity) {
  for (int d : {1, 8, 128}) {
    EXPECT_EQ((expm<double>(Eigen::MatrixXd::Zero(d, d)) - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff(), 0.0);
    EXPECT_EQ((expm<float>(Eigen::MatrixXf::Zero(d, d)) - Eigen::MatrixXf::Identity(d, d)).cwiseAbs().maxCoeff(), 0.f);
    const SkewExpm se(Eigen::MatrixXd::Zero(d, d));
    EXPECT_EQ((se.exp() - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff(), 0.0);
  }
}

TEST(CalibExpm, ExpmOfSkewIsOrthogonalD128Norms0p1To3) {
  std::mt19937 rng(1);
  const int d = 128;
  for (double nrm : {0.1, 0.5, 1.0, 3.0}) {
    const Eigen::MatrixXd x = random_skew(d, nrm, rng);
    const Eigen::MatrixXd id = Eigen::MatrixXd::Identity(d, d);
    const Eigen::MatrixXd e = expm<double>(x);
    EXPECT_LT((e.transpose() * e - id).cwiseAbs().maxCoeff(), 1e-12) << nrm;
    const Eigen::MatrixXf ef = expm<float>(x.cast<float>());
    EXPECT_LT((ef.transpose() * ef - id.cast<float>()).cwiseAbs().maxCoeff(), 1e-5f) << nrm;
    EXPECT_LT((ef.cast<double>() - e).cwiseAbs().maxCoeff(), 1e-6) << nrm;
    const SkewExpm se(x);
    EXPECT_LT((se.exp().transpose() * se.exp() - id).cwiseAbs().maxCoeff(), 1e-12) << nrm;
    EXPECT_LT((se.exp() - e).cwiseAbs().maxCoeff(), 1e-12) << nrm;
  }
}

TEST(CalibExpm, PadeMatchesTaylorSeriesIncludingLargeNormsWithSquaring) {
  std::mt19937 rng(2);
  for (double nrm : {0.3, 2.0, 20.0}) {
    Eigen::MatrixXd x = random_skew(16, nrm, rng);
    x(0, 1) += 0.2;  // not skew: the general path
    const Eigen::MatrixXd want = taylor_expm(x / 64.0, 40);
    Eigen::MatrixXd w = want;
    for (int i = 0; i < 6; ++i) w = (w * w).eval();
    EXPECT_LT((expm<double>(x) - w).cwiseAbs().maxCoeff() / w.cwiseAbs().maxCoeff(), 1e-11) << nrm;
  }
}

TEST(CalibExpm, FastSkewAdjointMatchesBlockReference) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  for (int d : {8, 64}) {
    for (double nrm : {0.1, 1.0, 10.0}) {
      const Eigen::MatrixXd x = random_skew(d, nrm, rng);
      Eigen::MatrixXd g(d, d);
      for (int i = 0; i < g.size(); ++i) g.data()[i] = nd(rng);
      const Eigen::MatrixXd want = expm_frechet_adjoint_ref(x, g);
      const Eigen::MatrixXd got = SkewExpm(x).adjoint(g);
      EXPECT_LT((got - want).cwiseAbs().maxCoeff() / want.cwiseAbs().maxCoeff(), 1e-10) << d << " " << nrm;
    }
  }
}

TEST(CalibExpm, AdjointGradientMatchesFiniteDifferencesOfLinearLoss) {
  // L(A) = <W, expm(A − Aᵀ)>; ∂L/∂A = G_X − G_Xᵀ with G_X = adjoint Fréchet derivative at X for upstream W.
  std::mt19937 rng(4);
  std::normal_distribution<double> nd;
  const int d = 12;
  for (double nrm : {0.2, 2.0}) {
    Eigen::MatrixXd a(d, d), w(d, d);
    for (int i = 0; i < a.size(); ++i) a.data()[i] = nd(rng), w.data()[i] = nd(rng);
    a *= nrm / skew_part(a).norm();
    const auto loss = [&](const Eigen::MatrixXd& aa) { return (w.array() * expm<double>(skew_part(aa)).array()).sum(); };
    const Eigen::MatrixXd g_ref = skew_grad(expm_frechet_adjoint_ref(skew_part(a), w));
    const Eigen::MatrixXd g_fast = skew_grad(SkewExpm(skew_part(a)).adjoint(w));
    const double h = 1e-6;
    double max_rel = 0;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        Eigen::MatrixXd ap = a, am = a;
        ap(i, j) += h, am(i, j) -= h;
        const double fd = (loss(ap) - loss(am)) / (2 * h);
        max_rel = std::max(max_rel, std::fabs(fd - g_ref(i, j)) / (std::fabs(fd) + 1e-3));
        EXPECT_NEAR(g_fast(i, j), g_ref(i, j), 1e-9 * (1 + std::fabs(g_ref(i, j))));
      }
    EXPECT_LT(max_rel, 1e-3) << nrm;
  }
}

TEST(CalibExpm, RejectsNonSquareAndNonSkew) {
  EXPECT_THROW(expm<double>(Eigen::MatrixXd::Zero(3, 4)), Error);
  Eigen::MatrixXd x = Eigen::MatrixXd::Zero(4, 4);
  x(0, 1) = 1.0;
  EXPECT_THROW(SkewExpm{x}, Error);
  EXPECT_THROW(SkewExpm(Eigen::MatrixXd::Zero(4, 4)).adjoint(Eigen::MatrixXd::Zero(3, 3)), Error);
}
