// OSCAR: bit reversal; the permutation rule on a hand-computed d = 4 case; recovery of a known eigenbasis
// from streamed synthetic queries and values; R orthogonal; the value weights w_t = k_tᵀ C_Q k_t.
#include <random>

#include <gtest/gtest.h>

#include "calib/oscar.h"
#include "common/error.h"
#include "rotation/hadamard.h"

using namespace kvq;

namespace {

Eigen::MatrixXd random_orthogonal(int d, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  Eigen::MatrixXd m(d, d);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
  return Eigen::HouseholderQR<Eigen::MatrixXd>(m).householderQ();
}

// n rows distributed as N(0, U diag(lambda) Uᵀ).
RowMat<float> gaussian_rows(int n, const Eigen::MatrixXd& u, const Eigen::VectorXd& lambda, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  const int d = int(u.rows());
  Eigen::MatrixXd z(n, d);
  for (int i = 0; i < z.size(); ++i) z.data()[i] = nd(rng);
  return (z * lambda.cwiseSqrt().asDiagonal() * u.transpose()).cast<float>();
}

}  // namespace

TEST(CalibOscar, BitReverse) {
  EXPECT_EQ(bit_reverse(1, 4), 2);
  EXPECT_EQ(bit_reverse(2, 4), 1);
  EXPECT_EQ(bit_reverse(3, 4), 3);
  EXPECT_EQ(bit_reverse(1, 8), 4);
  EXPECT_EQ(bit_reverse(6, 8), 3);
  EXPECT_EQ(bit_reverse(0, 1), 0);
  EXPECT_THROW(bit_reverse(4, 4), Error);
}

TEST(CalibOscar, PermutationRuleHandComputedD4) {
  // C = diag(3, 1, 4, 2): ascending eigenvalues 1, 2, 3, 4 on e1, e3, e0, e2. Indices of Λ sorted descending:
  // (3, 2, 1, 0). bitrev over 2 bits: 0→0, 1→2, 2→1, 3→3, so perm[0] = 3, perm[2] = 2, perm[1] = 1, perm[3] = 0.
  Eigen::MatrixXd c = Eigen::Vector4d(3, 1, 4, 2).asDiagonal();
  const OscarBasis b = oscar_rotation_from_covariance(c);
  EXPECT_EQ(b.perm, (std::vector<int>{3, 1, 2, 0}));
  EXPECT_NEAR(b.lambda(0), 1, 1e-12);
  EXPECT_NEAR(b.lambda(3), 4, 1e-12);
  const int axis[4] = {1, 3, 0, 2};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(std::fabs(b.u(axis[i], i)), 1.0, 1e-12);
  const Eigen::MatrixXd uh = b.u * hadamard_matrix(4);
  Eigen::MatrixXd want(4, 4);
  want << uh.col(3), uh.col(1), uh.col(2), uh.col(0);
  EXPECT_LT((b.r - want).cwiseAbs().maxCoeff(), 1e-15);
}

TEST(CalibOscar, RecoversKnownEigenbasisFromStreamedChunks) {
  std::mt19937 rng(5);
  const int d = 16, n_kv = 2;
  const Eigen::MatrixXd u_q = random_orthogonal(d, rng), u_v = random_orthogonal(d, rng);
  Eigen::VectorXd lam(d);
  for (int i = 0; i < d; ++i) lam(i) = std::pow(1.6, i);  // distinct, ascending
  OscarAccumulator acc(n_kv, d);
  for (int h = 0; h < n_kv; ++h)
    for (int chunk = 0; chunk < 4; ++chunk) {
      // Keys all equal (w_t constant), so C_V is the plain value covariance.
      const RowMat<float> k = RowMat<float>::Constant(5000, d, 0.25f);
      acc.add(h, gaussian_rows(2 * 5000, u_q, lam, rng), k, gaussian_rows(5000, u_v, lam, rng));
    }
  const OscarRotations r = acc.build();
  for (const auto* pr : {&r.key, &r.value}) {
    const Eigen::MatrixXd& u_true = pr == &r.key ? u_q : u_v;
    for (int i = 0; i < d; ++i) EXPECT_GT(std::fabs(u_true.col(i).dot(pr->u.col(i))), 0.999) << i;
    for (int i = 0; i < d; ++i) EXPECT_NEAR(pr->lambda(i) / lam(i), 1.0, 0.05) << i;
    EXPECT_LT((pr->r.transpose() * pr->r - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff(), 1e-12);
  }
}

TEST(CalibOscar, ValueCovarianceUsesQueryWeightedKeys) {
  // One head, d = 2, every statistic computed by hand.
  OscarAccumulator acc(1, 2);
  RowMat<float> q(2, 2), k(2, 2), v(2, 2);
  q << 2, 0, 0, 0;   // C_Q = (qᵀq)/2 = diag(2, 0)
  k << 1, 0, 3, 5;   // w = (2·1, 2·9) = (2, 18), mean 10 → rescaled (0.2, 1.8)
  v << 1, 1, 0, 2;   // C_V = (0.2·[1 1;1 1] + 1.8·[0 0;0 4]) / 2 = [0.1 0.1; 0.1 3.7]
  acc.add(0, q, k, v);
  const OscarRotations r = acc.build();
  EXPECT_NEAR(r.c_k(0, 0), 2.0, 1e-12);
  EXPECT_NEAR(r.c_k(1, 1), 0.0, 1e-12);
  EXPECT_NEAR(r.c_v(0, 0), 0.1, 1e-12);
  EXPECT_NEAR(r.c_v(0, 1), 0.1, 1e-12);
  EXPECT_NEAR(r.c_v(1, 1), 3.7, 1e-12);
}

TEST(CalibOscar, TwoPassApiEqualsOnePass) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const auto rnd = [&](int r, int c) {
    RowMat<float> m(r, c);
    for (int i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
    return m;
  };
  const int d = 8, n_kv = 2, chunks = 3;
  std::vector<RowMat<float>> qs, ks, vs;
  for (int i = 0; i < n_kv * chunks; ++i) qs.push_back(rnd(40, d)), ks.push_back(rnd(20, d)), vs.push_back(rnd(20, d));
  OscarAccumulator one(n_kv, d), two(n_kv, d);
  for (int i = 0; i < n_kv * chunks; ++i) one.add(i % n_kv, qs[size_t(i)], ks[size_t(i)], vs[size_t(i)]);
  for (int i = 0; i < n_kv * chunks; ++i) two.add_queries(i % n_kv, qs[size_t(i)]);
  EXPECT_THROW(two.build(), Error);  // pass 2 missing
  for (int i = 0; i < n_kv * chunks; ++i) two.add_keys_values(i % n_kv, ks[size_t(i)], vs[size_t(i)]);
  EXPECT_THROW(two.add_queries(0, qs[0]), Error);  // C_Q is frozen once pass 2 starts
  EXPECT_THROW(two.add(0, qs[0], ks[0], vs[0]), Error);
  const OscarRotations a = one.build(), b = two.build();
  EXPECT_LT((a.c_k - b.c_k).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LT((a.c_v - b.c_v).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LT((a.value.r - b.value.r).cwiseAbs().maxCoeff(), 1e-9);
}

TEST(CalibOscar, RejectsBadInput) {
  EXPECT_THROW(OscarAccumulator(1, 96), Error);
  OscarAccumulator acc(2, 4);
  RowMat<float> q = RowMat<float>::Ones(3, 4), k = RowMat<float>::Ones(2, 4), v = RowMat<float>::Ones(3, 4);
  EXPECT_THROW(acc.add(0, q, k, v), Error);  // 2 keys, 3 values
  EXPECT_THROW(acc.add(2, q, k, k), Error);  // head out of range
  acc.add(0, q, k, k);
  EXPECT_THROW(acc.build(), Error);  // head 1 has no data
}
