#include "calib/oscar.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "rotation/hadamard.h"

namespace kvq {

int bit_reverse(int i, int d) {
  KVQ_CHECK(is_power_of_two(d) && i >= 0 && i < d, "bit_reverse: i = {}, d = {}", i, d);
  int r = 0;
  for (int b = 1; b < d; b <<= 1, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}

OscarBasis oscar_rotation_from_covariance(const Eigen::MatrixXd& c) {
  const int d = int(c.rows());
  KVQ_CHECK(c.rows() == c.cols() && is_power_of_two(d), "OSCAR: covariance is {}x{}, need d×d with d a power of 2",
            c.rows(), c.cols());
  KVQ_CHECK(c.allFinite(), "OSCAR: covariance has non-finite entries");
  const Eigen::MatrixXd sym = 0.5 * (c + c.transpose());
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(sym);
  KVQ_CHECK(es.info() == Eigen::Success, "OSCAR: eigendecomposition did not converge");
  OscarBasis b;
  b.u = es.eigenvectors();
  b.lambda = es.eigenvalues();
  std::vector<int> desc(static_cast<size_t>(d));
  std::iota(desc.begin(), desc.end(), 0);
  std::stable_sort(desc.begin(), desc.end(), [&](int x, int y) { return b.lambda(x) > b.lambda(y); });
  b.perm.assign(size_t(d), 0);
  for (int i = 0; i < d; ++i) b.perm[size_t(bit_reverse(i, d))] = desc[size_t(i)];
  const Eigen::MatrixXd uh = b.u * hadamard_matrix(d);
  b.r.resize(d, d);
  for (int j = 0; j < d; ++j) b.r.col(j) = uh.col(b.perm[size_t(j)]);  // (U H) · I[:, perm]
  return b;
}

OscarAccumulator::OscarAccumulator(int n_kv_heads, int head_dim)
    : n_kv_(n_kv_heads), d_(head_dim), n_q_rows_(size_t(std::max(n_kv_heads, 0)), 0) {
  KVQ_CHECK(n_kv_heads > 0 && is_power_of_two(head_dim), "OSCAR: n_kv_heads = {}, head_dim = {} (power of 2 needed)",
            n_kv_heads, head_dim);
  qq_.assign(size_t(n_kv_), Eigen::MatrixXd::Zero(d_, d_));
  keys_.resize(size_t(n_kv_));
  values_.resize(size_t(n_kv_));
}

void OscarAccumulator::add(int head, const RowMat<float>& q, const RowMat<float>& k, const RowMat<float>& v) {
  KVQ_CHECK(head >= 0 && head < n_kv_, "OSCAR add: head {} out of range 0..{}", head, n_kv_ - 1);
  KVQ_CHECK(q.cols() == d_ && k.cols() == d_ && v.cols() == d_ && k.rows() == v.rows(),
            "OSCAR add: q {}x{}, k {}x{}, v {}x{}; expected d = {} and as many keys as values", q.rows(), q.cols(),
            k.rows(), k.cols(), v.rows(), v.cols(), d_);
  KVQ_CHECK(q.allFinite() && k.allFinite() && v.allFinite(), "OSCAR add: non-finite input for head {}", head);
  const Eigen::MatrixXd qd = q.cast<double>();
  qq_[size_t(head)].noalias() += qd.transpose() * qd;
  n_q_rows_[size_t(head)] += q.rows();
  if (k.rows() > 0) {
    keys_[size_t(head)].push_back(k);
    values_[size_t(head)].push_back(v);
  }
}

OscarRotations OscarAccumulator::build() const {
  OscarRotations out;
  out.c_k = Eigen::MatrixXd::Zero(d_, d_);
  out.c_v = Eigen::MatrixXd::Zero(d_, d_);
  for (int h = 0; h < n_kv_; ++h) {
    KVQ_CHECK(n_q_rows_[size_t(h)] > 0 && !keys_[size_t(h)].empty(), "OSCAR build: head {} has no {}", h,
              n_q_rows_[size_t(h)] > 0 ? "keys/values" : "queries");
    const Eigen::MatrixXd cq = qq_[size_t(h)] / double(n_q_rows_[size_t(h)]);
    out.c_k += cq;
    // Σ_t w_t v_t v_tᵀ / n with w rescaled to mean 1  ==  Σ_t w_t v_t v_tᵀ / Σ_t w_t.
    Eigen::MatrixXd wvv = Eigen::MatrixXd::Zero(d_, d_);
    double w_sum = 0;
    for (size_t c = 0; c < keys_[size_t(h)].size(); ++c) {
      const Eigen::MatrixXd kd = keys_[size_t(h)][c].cast<double>(), vd = values_[size_t(h)][c].cast<double>();
      const Eigen::VectorXd w = ((kd * cq).array() * kd.array()).rowwise().sum();  // w_t = k_tᵀ C_Q k_t
      wvv.noalias() += vd.transpose() * (w.asDiagonal() * vd);
      w_sum += w.sum();
    }
    KVQ_CHECK(w_sum > 0, "OSCAR build: head {} has all-zero value weights (zero keys or queries)", h);
    out.c_v += wvv / w_sum;
  }
  out.c_k /= double(n_kv_);
  out.c_v /= double(n_kv_);
  out.key = oscar_rotation_from_covariance(out.c_k);
  out.value = oscar_rotation_from_covariance(out.c_v);
  return out;
}

}  // namespace kvq
