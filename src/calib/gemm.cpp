#include "calib/gemm.h"

#include <cblas.h>

#include "common/error.h"

namespace kvq {

namespace {

template <class T>
void check_shapes(const ConstRowRef<T>& a, bool ta, const ConstRowRef<T>& b, bool tb, const RowRef<T>& c) {
  const Eigen::Index m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols();
  const Eigen::Index kb = tb ? b.cols() : b.rows(), n = tb ? b.rows() : b.cols();
  KVQ_CHECK(k == kb && c.rows() == m && c.cols() == n, "gemm: op(A) {}x{} · op(B) {}x{} into C {}x{}", m, k, kb, n,
            c.rows(), c.cols());
}

}  // namespace

template <>
void gemm<double>(double alpha, ConstRowRef<double> a, bool ta, ConstRowRef<double> b, bool tb, double beta,
                  RowRef<double> c) {
  check_shapes(a, ta, b, tb, c);
  if (beta == 0.0) c.setZero();
  else if (beta != 1.0) c *= beta;
  if (ta && tb) c.noalias() += alpha * a.transpose() * b.transpose();
  else if (ta) c.noalias() += alpha * a.transpose() * b;
  else if (tb) c.noalias() += alpha * a * b.transpose();
  else c.noalias() += alpha * a * b;
}

template <>
void gemm<float>(float alpha, ConstRowRef<float> a, bool ta, ConstRowRef<float> b, bool tb, float beta,
                 RowRef<float> c) {
  check_shapes(a, ta, b, tb, c);
  const int m = int(c.rows()), n = int(c.cols()), k = int(ta ? a.rows() : a.cols());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.f) c.setZero();
    else c *= beta;
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a.data(),
              int(a.outerStride()), b.data(), int(b.outerStride()), beta, c.data(), int(c.outerStride()));
}

BlasSingleThreadScope::BlasSingleThreadScope() : previous_(openblas_get_num_threads()) {
  openblas_set_num_threads(1);
}
BlasSingleThreadScope::~BlasSingleThreadScope() { openblas_set_num_threads(previous_); }

Eigen::MatrixXcd zgemm(const Eigen::MatrixXcd& a, bool adj_a, const Eigen::MatrixXcd& b, bool adj_b) {
  const Eigen::Index m = adj_a ? a.cols() : a.rows(), k = adj_a ? a.rows() : a.cols();
  const Eigen::Index kb = adj_b ? b.cols() : b.rows(), n = adj_b ? b.rows() : b.cols();
  KVQ_CHECK(k == kb, "zgemm: op(A) {}x{} · op(B) {}x{}", m, k, kb, n);
  Eigen::MatrixXcd c(m, n);
  if (m == 0 || n == 0) return c;
  const std::complex<double> one(1.0, 0.0), zero(0.0, 0.0);
  cblas_zgemm(CblasColMajor, adj_a ? CblasConjTrans : CblasNoTrans, adj_b ? CblasConjTrans : CblasNoTrans, int(m),
              int(n), int(k), &one, a.data(), int(a.rows()), b.data(), int(b.rows()), &zero, c.data(), int(m));
  return c;
}

}  // namespace kvq
