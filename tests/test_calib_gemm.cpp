// Calibration products: the OpenBLAS float path equals the Eigen double reference on blocks with outer strides,
// every transpose combination and beta = 0 / 1 / other; the complex product equals Eigen's.
#include <random>

#include <gtest/gtest.h>

#include "calib/gemm.h"
#include "common/error.h"

using namespace kvq;

TEST(CalibGemm, FloatBlasMatchesDoubleReferenceOnStridedBlocks) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  const auto rnd = [&](int r, int c) {
    RowMat<float> m(r, c);
    for (int i = 0; i < m.size(); ++i) m.data()[i] = ud(rng);
    return m;
  };
  const int m = 7, n = 5, k = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.f, 1.f, -0.5f}) {
        RowMat<float> abig = rnd(20, 20), bbig = rnd(20, 20), cbig = rnd(20, 20);
        auto a = abig.block(1, 2, ta ? k : m, ta ? m : k);
        auto b = bbig.block(3, 1, tb ? n : k, tb ? k : n);
        RowMat<double> want = beta * cbig.block(2, 3, m, n).cast<double>();
        const Eigen::MatrixXd ad = a.cast<double>(), bd = b.cast<double>();
        want += 0.75 * (ta ? Eigen::MatrixXd(ad.transpose()) : ad) * (tb ? Eigen::MatrixXd(bd.transpose()) : bd);
        gemm<float>(0.75f, a, ta, b, tb, beta, cbig.block(2, 3, m, n));
        EXPECT_LT((cbig.block(2, 3, m, n).cast<double>() - want).cwiseAbs().maxCoeff(), 1e-5) << ta << tb << beta;
      }
}

TEST(CalibGemm, DoubleReferenceIsExactProduct) {
  RowMat<double> a(2, 3), b(3, 2), c = RowMat<double>::Ones(2, 2);
  a << 1, 2, 3, 4, 5, 6;
  b << 1, 0, 0, 1, 1, 1;
  gemm<double>(2.0, a, false, b, false, 1.0, c);
  RowMat<double> want(2, 2);
  want << 9, 11, 21, 23;
  EXPECT_EQ((c - want).cwiseAbs().maxCoeff(), 0.0);
}

TEST(CalibGemm, ComplexProductMatchesEigen) {
  const Eigen::MatrixXcd a = Eigen::MatrixXcd::Random(6, 4), b = Eigen::MatrixXcd::Random(6, 5);
  EXPECT_LT((zgemm(a, true, b, false) - a.adjoint() * b).cwiseAbs().maxCoeff(), 1e-13);
  const Eigen::MatrixXcd c = Eigen::MatrixXcd::Random(4, 5);
  EXPECT_LT((zgemm(a, false, c, false) - a * c).cwiseAbs().maxCoeff(), 1e-13);
  EXPECT_LT((zgemm(c, true, a, true) - c.adjoint() * a.adjoint()).cwiseAbs().maxCoeff(), 1e-13);
}

TEST(CalibGemm, RejectsMismatchedShapes) {
  RowMat<float> a = RowMat<float>::Zero(2, 3), b = RowMat<float>::Zero(2, 3), c = RowMat<float>::Zero(2, 2);
  EXPECT_THROW(gemm<float>(1.f, a, false, b, false, 0.f, c), Error);
}
