// Walsh–Hadamard rotation: the explicit matrix is orthogonal and Sylvester-ordered; the fast transform equals
// the matrix product; bad dimensions are rejected.
#include <random>

#include <gtest/gtest.h>

#include "common/error.h"
#include "kv/transform.h"
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

// KvTransform's Walsh–Hadamard path (k_hadamard / v_hadamard) against the dense product of the same matrices (the
// exact rotation kernel, summing a = 0 .. d-1 in double): both round the same double value to float, so the outputs
// are equal except where the two double sums straddle a float's rounding boundary. Counted over a million outputs of
// keys, queries, values and attention outputs, for QuaRot's H_d and llama.cpp's 64-blocks.
TEST(Hadamard, TransformFastPathGivesTheDenseProductsFloats) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> scale(-6.f, 6.f);
  size_t outputs = 0, differ = 0;
  for (const auto& [d, block] : std::vector<std::pair<int, int>>{{64, 64}, {128, 128}, {128, 64}, {256, 256}}) {
    KvTransform fast;
    fast.n_layers = 2, fast.n_kv_heads = 2, fast.head_dim = d, fast.name = "hadamard";
    fast.r_k = fast.r_v = block_hadamard(block, d, 4);
    fast.k_hadamard = fast.v_hadamard = block;
    KvTransform dense = fast;
    dense.k_hadamard = dense.v_hadamard = 0;
    // keys and values [n, 2, d], queries and attention outputs [n, 4, d]
    const int n = 1000000 / (4 * d * 4) + 1, heads = 4;
    std::vector<float> k(size_t(n) * 2 * d), v = k, q(size_t(n) * heads * d), o = q;
    for (auto* x : {&k, &v, &q, &o})
      for (size_t i = 0; i < x->size(); i += size_t(d)) {
        const float s = std::exp2(scale(rng));  // rows of every magnitude, values of both signs
        for (int c = 0; c < d; ++c) (*x)[i + size_t(c)] = s * nd(rng) * (c % 17 == 0 ? 30.f : 1.f);
      }
    auto k2 = k, v2 = v, q2 = q, o2 = o;
    for (int layer = 0; layer < 2; ++layer) {
      fast.inputs(layer, n, k.data(), v.data(), heads, q.data(), {SimdLevel::kScalar});
      fast.outputs(layer, n, heads, o.data(), {SimdLevel::kScalar});
      dense.inputs(layer, n, k2.data(), v2.data(), heads, q2.data(), {SimdLevel::kScalar});
      dense.outputs(layer, n, heads, o2.data(), {SimdLevel::kScalar});
    }
    for (const auto& [a, b] : {std::pair{&k, &k2}, {&v, &v2}, {&q, &q2}, {&o, &o2}})
      for (size_t i = 0; i < a->size(); ++i) {
        ++outputs;
        if ((*a)[i] == (*b)[i]) continue;
        ++differ;
        ASSERT_EQ(std::nextafter((*a)[i], (*b)[i]), (*b)[i]) << "d " << d << " block " << block << " output " << i;
      }
  }
  std::printf("  Walsh–Hadamard path against the dense product: %zu of %zu floats differ (by one ulp)\n", differ,
              outputs);
  EXPECT_GE(outputs, size_t(1000000));
  EXPECT_LE(differ, outputs / 100000);
}
