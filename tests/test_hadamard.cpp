// Walsh–Hadamard rotation: the explicit matrix is orthogonal and Sylvester-ordered; the fast transform equals
// the matrix product; bad dimensions are rejected.
#include <random>

#include <gtest/gtest.h>

#include "common/error.h"
#include "rotation/hadamard.h"

using namespace kvq;

TEST(Hadamard, MatrixIsOrthogonalAndSymmetricForEveryPowerOfTwo) {
  for (int d = 1; d <= 256; d *= 2) {
    const Eigen::MatrixXd h = hadamard_matrix(d);
    EXPECT_LT((h * h.transpose() - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff(), 1e-12) << d;
    EXPECT_EQ((h - h.transpose()).cwiseAbs().maxCoeff(), 0.0) << d;
  }
}

TEST(Hadamard, MatrixHasSylvesterOrderD4) {
  const Eigen::MatrixXd h = hadamard_matrix(4) * 2.0;  // sqrt(4) = 2
  Eigen::MatrixXd want(4, 4);
  want << 1, 1, 1, 1, 1, -1, 1, -1, 1, 1, -1, -1, 1, -1, -1, 1;
  EXPECT_EQ((h - want).cwiseAbs().maxCoeff(), 0.0);
}

TEST(Hadamard, FastTransformEqualsMatrixProduct) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int d : {1, 2, 8, 64, 128, 256}) {
    const int rows = 5;
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> x(rows, d);
    for (int i = 0; i < x.size(); ++i) x.data()[i] = nd(rng);
    const Eigen::MatrixXd want = x.cast<double>() * hadamard_matrix(d);
    auto y = x;
    fwht_rows(y.data(), rows, d);
    EXPECT_LT((y.cast<double>() - want).cwiseAbs().maxCoeff(), 1e-5) << d;
    Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> xd = x.cast<double>();
    fwht_rows(xd.data(), rows, d);
    EXPECT_LT((xd - want).cwiseAbs().maxCoeff(), 1e-12) << d;
  }
}

TEST(Hadamard, FastTransformTwiceIsIdentity) {
  std::vector<double> x = {1.5, -2.0, 0.25, 3.0, 0.0, -1.0, 7.0, 2.5};
  auto y = x;
  fwht_rows(y.data(), 1, 8);
  fwht_rows(y.data(), 1, 8);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

TEST(Hadamard, RejectsNonPowerOfTwo) {
  EXPECT_THROW(hadamard_matrix(96), Error);
  EXPECT_THROW(hadamard_matrix(0), Error);
  float x[12] = {};
  EXPECT_THROW(fwht_rows(x, 1, 12), Error);
}
