// Dense products of calibration's hot loops. float goes to OpenBLAS (kernels chosen at run time for the CPU:
// AVX2 / AVX-512), since the portable -O2 build leaves Eigen at SSE2; double goes through Eigen (the reference,
// used by the finite-difference tests). Operands are row-major matrices or row-major blocks with unit inner
// stride (e.g. middleCols / middleRows of a RowMat).
#pragma once

#include <complex>

#include <Eigen/Dense>

#include "calib/ste_quant.h"

namespace kvq {

template <class T>
using RowRef = Eigen::Ref<RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstRowRef = Eigen::Ref<const RowMat<T>, 0, Eigen::OuterStride<>>;

// C = alpha · op(A) · op(B) + beta · C, op(X) = Xᵀ when the flag is set. C must already have the result shape.
// T = float: OpenBLAS sgemm; T = double: Eigen.
template <class T>
void gemm(T alpha, ConstRowRef<T> a, bool trans_a, ConstRowRef<T> b, bool trans_b, T beta, RowRef<T> c);
template <>
void gemm<float>(float, ConstRowRef<float>, bool, ConstRowRef<float>, bool, float, RowRef<float>);
template <>
void gemm<double>(double, ConstRowRef<double>, bool, ConstRowRef<double>, bool, double, RowRef<double>);

// While alive, OpenBLAS runs single-threaded (calibration parallelises across heads, one BLAS thread per worker;
// OpenBLAS's own pool contends with the workers); the previous thread count is restored on destruction. This is
// process-wide OpenBLAS state: do not overlap it with other BLAS users that want threads.
class BlasSingleThreadScope {
 public:
  BlasSingleThreadScope();
  ~BlasSingleThreadScope();
  BlasSingleThreadScope(const BlasSingleThreadScope&) = delete;
  BlasSingleThreadScope& operator=(const BlasSingleThreadScope&) = delete;

 private:
  int previous_;  // OpenBLAS thread count before the scope
};

// op(A) · op(B) for column-major complex matrices (op = conjugate transpose when the flag is set), OpenBLAS zgemm.
Eigen::MatrixXcd zgemm(const Eigen::MatrixXcd& a, bool adj_a, const Eigen::MatrixXcd& b, bool adj_b);

}  // namespace kvq
