// OSCAR rotations (METHODS §4): one key rotation and one value rotation per layer, shared by its kv heads,
// from calibration statistics accumulated in float64.
//   C_Q^h = Q_hᵀ Q_h / (n·g)    Q_h: the post-RoPE queries of kv head h's g query heads (n·g rows)
//   C_K   = (1/n_kv) Σ_h C_Q^h
//   C_V   = (1/n_kv) Σ_h Σ_t w_t v_t v_tᵀ / n,  w_t = k_tᵀ C_Q^h k_t rescaled to average 1 over head h's tokens
// Each C is symmetrised and eigendecomposed, C = U Λ Uᵀ (ascending eigenvalues), and R = U · H · P with H the
// normalised Sylvester Hadamard matrix and P = I[:, perm], perm[bitrev(i)] = (indices of Λ sorted descending)[i].
//
// Streaming, two ways (not to be mixed in one accumulator):
//  - one pass, add(q, k, v) per chunk: C_Q^h is summed on the fly, but the value weights need the FINAL C_Q^h,
//    so keys and values are kept (float, 2·n·d·4 bytes per head) until build();
//  - two passes, O(d²) memory: add_queries(q) for every chunk, then add_keys_values(k, v) for every chunk
//    (weights use the complete C_Q^h; no add_queries after the first add_keys_values of any head).
#pragma once

#include <vector>

#include <Eigen/Dense>

#include "calib/ste_quant.h"

namespace kvq {

// bitrev over log2(d) bits (d a power of two).
int bit_reverse(int i, int d);

// One OSCAR rotation from a covariance (symmetrised inside).
struct OscarBasis {
  Eigen::MatrixXd u;       // (d, d) eigenvectors, columns in ascending eigenvalue order
  Eigen::VectorXd lambda;  // (d) eigenvalues, ascending
  std::vector<int> perm;   // (d) column permutation: P = I[:, perm]
  Eigen::MatrixXd r;       // (d, d) R = U · H · P
};
OscarBasis oscar_rotation_from_covariance(const Eigen::MatrixXd& c);

struct OscarRotations {
  Eigen::MatrixXd c_k, c_v;  // (d, d) the covariances used (before symmetrising)
  OscarBasis key, value;     // the rotations and their eigen-decompositions
};

class OscarAccumulator {
 public:
  OscarAccumulator(int n_kv_heads, int head_dim);
  // One calibration chunk of kv head `head`: q (rows = g·n of its query heads, any order; g·n may differ from n),
  // k, v (n, d) post-RoPE keys (as the cache holds them) and values of the same tokens.
  void add(int head, const RowMat<float>& q, const RowMat<float>& k, const RowMat<float>& v);
  // Two-pass API: pass 1 (queries), then pass 2 (keys and values of the same tokens as one another).
  void add_queries(int head, const RowMat<float>& q);
  void add_keys_values(int head, const RowMat<float>& k, const RowMat<float>& v);
  // Computes C_K, C_V and both rotations. Every head needs at least one query and one token.
  OscarRotations build() const;

 private:
  int n_kv_, d_;
  std::vector<Eigen::MatrixXd> qq_;                 // n_kv × (d, d) Σ q qᵀ
  std::vector<long long> n_q_rows_;                 // n_kv: query rows summed
  std::vector<std::vector<RowMat<float>>> keys_;    // n_kv × chunks × (n, d)
  std::vector<std::vector<RowMat<float>>> values_;  // n_kv × chunks × (n, d)
  std::vector<Eigen::MatrixXd> wvv_;                // n_kv × (d, d) two-pass Σ_t w_t v_t v_tᵀ
  std::vector<double> w_sum_;                       // n_kv: two-pass Σ_t w_t
  enum class Mode { kEmpty, kOnePass, kQueries, kValues } mode_ = Mode::kEmpty;  // which API is in use

  void check_add(int head, const RowMat<float>& x, const char* what) const;
  static void accumulate_values(const Eigen::MatrixXd& cq, const RowMat<float>& k, const RowMat<float>& v,
                                Eigen::MatrixXd& wvv, double& w_sum);
};

}  // namespace kvq
