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
  wvv_.assign(size_t(n_kv_), Eigen::MatrixXd::Zero(d_, d_));
  w_sum_.assign(size_t(n_kv_), 0.0);
  keys_.resize(size_t(n_kv_));
  values_.resize(size_t(n_kv_));
}

void OscarAccumulator::check_add(int head, const RowMat<float>& x, const char* what) const {
  KVQ_CHECK(head >= 0 && head < n_kv_, "OSCAR add: head {} out of range 0..{}", head, n_kv_ - 1);
  KVQ_CHECK(x.cols() == d_, "OSCAR add: {} have {} columns, head_dim is {}", what, x.cols(), d_);
  KVQ_CHECK(x.allFinite(), "OSCAR add: non-finite {} for head {}", what, head);
}

void OscarAccumulator::add(int head, const RowMat<float>& q, const RowMat<float>& k, const RowMat<float>& v) {
  KVQ_CHECK(mode_ == Mode::kEmpty || mode_ == Mode::kOnePass,
            "OSCAR add: the two-pass API (add_queries / add_keys_values) is already in use");
  check_add(head, q, "queries");
  check_add(head, k, "keys");
  check_add(head, v, "values");
  KVQ_CHECK(k.rows() == v.rows(), "OSCAR add: {} keys but {} values", k.rows(), v.rows());
  mode_ = Mode::kOnePass;
  const Eigen::MatrixXd qd = q.cast<double>();
  qq_[size_t(head)].noalias() += qd.transpose() * qd;
  n_q_rows_[size_t(head)] += q.rows();
  if (k.rows() > 0) {
    keys_[size_t(head)].push_back(k);
    values_[size_t(head)].push_back(v);
  }
}

void OscarAccumulator::add_queries(int head, const RowMat<float>& q) {
  KVQ_CHECK(mode_ == Mode::kEmpty || mode_ == Mode::kQueries,
            "OSCAR add_queries: {}", mode_ == Mode::kOnePass ? "the one-pass add() is already in use"
                                                             : "pass 2 (add_keys_values) has started");
  check_add(head, q, "queries");
  mode_ = Mode::kQueries;
  const Eigen::MatrixXd qd = q.cast<double>();
  qq_[size_t(head)].noalias() += qd.transpose() * qd;
  n_q_rows_[size_t(head)] += q.rows();
}

void OscarAccumulator::add_keys_values(int head, const RowMat<float>& k, const RowMat<float>& v) {
  KVQ_CHECK(mode_ == Mode::kQueries || mode_ == Mode::kValues,
            "OSCAR add_keys_values: needs pass 1 (add_queries) first and cannot follow add()");
  check_add(head, k, "keys");
  check_add(head, v, "values");
  KVQ_CHECK(k.rows() == v.rows(), "OSCAR add_keys_values: {} keys but {} values", k.rows(), v.rows());
  KVQ_CHECK(n_q_rows_[size_t(head)] > 0, "OSCAR add_keys_values: head {} had no queries in pass 1", head);
  mode_ = Mode::kValues;
  accumulate_values(qq_[size_t(head)] / double(n_q_rows_[size_t(head)]), k, v, wvv_[size_t(head)],
                    w_sum_[size_t(head)]);
}

// Σ_t w_t v_t v_tᵀ and Σ_t w_t with w_t = k_tᵀ C_Q k_t (the mean-1 rescale is Σ w v vᵀ / Σ w at build time).
void OscarAccumulator::accumulate_values(const Eigen::MatrixXd& cq, const RowMat<float>& k, const RowMat<float>& v,
                                         Eigen::MatrixXd& wvv, double& w_sum) {
  const Eigen::MatrixXd kd = k.cast<double>(), vd = v.cast<double>();
  const Eigen::VectorXd w = ((kd * cq).array() * kd.array()).rowwise().sum();
  wvv.noalias() += vd.transpose() * (w.asDiagonal() * vd);
  w_sum += w.sum();
}

OscarRotations OscarAccumulator::build() const {
  KVQ_CHECK(mode_ != Mode::kQueries, "OSCAR build: pass 2 (add_keys_values) has not run");
  OscarRotations out;
  out.c_k = Eigen::MatrixXd::Zero(d_, d_);
  out.c_v = Eigen::MatrixXd::Zero(d_, d_);
  for (int h = 0; h < n_kv_; ++h) {
    KVQ_CHECK(n_q_rows_[size_t(h)] > 0, "OSCAR build: head {} has no queries", h);
    const Eigen::MatrixXd cq = qq_[size_t(h)] / double(n_q_rows_[size_t(h)]);
    out.c_k += cq;
    // Σ_t w_t v_t v_tᵀ / n with w rescaled to mean 1  ==  Σ_t w_t v_t v_tᵀ / Σ_t w_t.
    Eigen::MatrixXd wvv = wvv_[size_t(h)];
    double w_sum = w_sum_[size_t(h)];
    for (size_t c = 0; c < keys_[size_t(h)].size(); ++c)
      accumulate_values(cq, keys_[size_t(h)][c], values_[size_t(h)][c], wvv, w_sum);
    KVQ_CHECK(w_sum > 0, "OSCAR build: head {} has no keys/values or all-zero value weights", h);
    out.c_v += wvv / w_sum;
  }
  out.c_k /= double(n_kv_);
  out.c_v /= double(n_kv_);
  out.key = oscar_rotation_from_covariance(out.c_k);
  out.value = oscar_rotation_from_covariance(out.c_v);
  return out;
}

}  // namespace kvq
