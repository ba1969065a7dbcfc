// OptR objectives for ONE kv head on ONE calibration chunk, with analytic gradients w.r.t. the rotations
// (METHODS §4). The calibration window: the chunk's last n_q query positions (causal: query at position p sees
// keys 0..p) of the g query heads sharing this kv head attend to the whole chunk; tokens < sink and the chunk's
// last `window` tokens use exact keys/values, every other token t is quantized through its rotation:
//     k̂_t = STE(k_t R_K) R_Kᵀ,   v̂_t = STE(v_t R_V) R_Vᵀ      (k already centred, STE = calib/ste_quant.h)
// so scores are q·k̂ without rotating q. Objectives (all averaged over the g query heads j; "mean(·)²" is the mean
// of squares over n_q × hidden; M_j = W_O^jᵀ W_O^j, so ‖X W_O^jᵀ‖² = Σ rows x M_j xᵀ):
//   key phase   KL(p_fp ‖ p_q) (mean over queries) + λ_K · mean(((p_q − p_fp) V) W_O^jᵀ)²      (values exact)
//   value phase mean((p_q ΔV) W_O^jᵀ)²,  ΔV = V̂ − V, p_q from keys fixed at R_K
//   joint       mean(Δy)², Δy = ((p_q − p_fp) V + p_q ΔV) W_O^jᵀ  (the exact post-W_O error, cross term in)
//   pre-wo      the joint error without W_O: mean over n_q × d of ((p_q − p_fp) V + p_q ΔV)²
//   recon       (‖K̂ − K‖² + ‖V̂ − V‖²) / (n·d)
// Gradients flow through k̂/v̂ (STE), the softmax and KL, to ∂L/∂R_K and ∂L/∂R_V; optr_grad_a() continues
// through R = R0·expm(A − Aᵀ).
#pragma once

#include <type_traits>
#include <vector>

#include <Eigen/Dense>

#include "calib/expm.h"
#include "calib/ste_quant.h"

namespace kvq {

template <class T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;  // column-major (Eigen default)

enum class OptrObjective { kKeyPhase, kValuePhase, kJoint, kPreWo, kRecon };
const char* optr_objective_name(OptrObjective o);

struct OptrLossConfig {
  int bits = 2;                // cache INT-b
  int group = 128;             // quantization group size (divides d)
  float clip_k = 0.96f;        // key quantile clip
  float clip_v = 0.92f;        // value quantile clip
  int sink = 64;               // S0: the chunk's first tokens kept exact
  int window = 256;            // W: the chunk's last tokens kept exact
  double lambda_k = 1.0;       // λ_K of the key phase
  double softmax_scale = 0.0;  // score scale (1/sqrt(d) for standard attention); must be set > 0
};

// One kv head of one calibration chunk, with everything that does not depend on the rotations precomputed.
template <class T>
struct OptrChunk {
  int g = 0;                 // query heads sharing this kv head
  int n_q = 0;               // query positions per head (the chunk's last n_q)
  int hidden = 0;            // rows of W_O (normaliser of the post-W_O mean)
  RowMat<T> q;               // (g·n_q, d) post-RoPE queries, row j·n_q + i = head j at position n − n_q + i
  RowMat<T> k;               // (n, d) centred post-RoPE keys
  RowMat<T> v;               // (n, d) values
  std::vector<ColMat<T>> wo_gram;  // g × (d, d) M_j = W_O^jᵀ W_O^j
  RowMat<T> s_fp;            // (g·n_q, n) exact scaled scores
  RowMat<T> p_fp;            // (g·n_q, n) exact probabilities (0 where causally masked)
  RowMat<T> logp_fp;         // (g·n_q, n) their logs (0 where masked)
  RowMat<T> y_fp;            // (g·n_q, d) exact attention outputs p_fp V
  ColMat<T> fixed_r_k;        // (d, d) key rotation that p_q_fixed was computed with (empty: none)
  RowMat<T> p_q_fixed;       // (g·n_q, n) value phase: p_q with keys fixed at fixed_r_k
};

// Builds a chunk. q: (g·n_q, d) as above; k, v: (n, d); w_o: g × (hidden, d) column slices of W_O per query head.
template <class T>
OptrChunk<T> optr_make_chunk(RowMat<T> q, RowMat<T> k, RowMat<T> v, const std::vector<ColMat<T>>& w_o,
                             const OptrLossConfig& cfg);

// Caches p_q for keys quantized at r_k (the value phase reuses it while r_k is unchanged).
template <class T>
void optr_fix_keys(OptrChunk<T>& c, const OptrLossConfig& cfg, const ColMat<T>& r_k);

// Frozen STE states (tests): with replay == false the forward records the states here; with replay == true it
// evaluates the frozen-state surrogate of ste_quant.h instead of the real quantizer.
template <class T>
struct OptrFrozen {
  bool replay = false;
  SteState<T> k, v;  // key / value STE states of the quantized token range
};

template <class T>
struct OptrGrads {
  ColMat<T> r_k;  // (d, d) ∂L/∂R_K (zero when the objective does not depend on R_K)
  ColMat<T> r_v;  // (d, d) ∂L/∂R_V (zero when the objective does not depend on R_V)
};

// Loss of one objective at rotations (r_k, r_v); gradients when grads != nullptr.
template <class T>
double optr_loss(const OptrChunk<T>& c, const OptrLossConfig& cfg, OptrObjective obj, const ColMat<T>& r_k,
                 const ColMat<T>& r_v, std::type_identity_t<OptrGrads<T>>* grads,
                 std::type_identity_t<OptrFrozen<T>>* frozen = nullptr);

// ∂L/∂A for R = R0·expm(A − Aᵀ), from ∂L/∂R and the SkewExpm of X = A − Aᵀ: skew_grad(L(Xᵀ, R0ᵀ ∂L/∂R)).
Eigen::MatrixXd optr_grad_a(const SkewExpm& e, const Eigen::MatrixXd& r0, const Eigen::MatrixXd& g_r);

void check_optr_loss_config(const OptrLossConfig& cfg, int d);

}  // namespace kvq
