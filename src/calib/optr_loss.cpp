#include "calib/optr_loss.h"

#include <algorithm>
#include <cmath>

#include "calib/gemm.h"
#include "common/error.h"

namespace kvq {

const char* optr_objective_name(OptrObjective o) {
  switch (o) {
    case OptrObjective::kKeyPhase: return "key-phase";
    case OptrObjective::kValuePhase: return "value-phase";
    case OptrObjective::kJoint: return "joint";
    case OptrObjective::kPreWo: return "pre-wo";
    case OptrObjective::kRecon: return "recon";
  }
  return "?";
}

void check_optr_loss_config(const OptrLossConfig& cfg, int d) {
  check_ste_spec(SteQuantSpec{cfg.bits, cfg.group, cfg.clip_k}, d);
  check_ste_spec(SteQuantSpec{cfg.bits, cfg.group, cfg.clip_v}, d);
  KVQ_CHECK(cfg.sink >= 0 && cfg.window >= 0, "OptR: sink = {} and window = {} must be >= 0", cfg.sink, cfg.window);
  KVQ_CHECK(cfg.lambda_k >= 0, "OptR: lambda_k = {} must be >= 0", cfg.lambda_k);
  KVQ_CHECK(cfg.softmax_scale > 0, "OptR: softmax_scale = {} must be > 0 (1/sqrt(head_dim) for standard attention)",
            cfg.softmax_scale);
}

namespace {

// The quantized token range [begin, begin + count) of an n-token chunk.
struct QuantRange {
  int begin, count;
};
QuantRange quant_range(int n, const OptrLossConfig& cfg) {
  const int a = std::min(cfg.sink, n), b = std::max(n - cfg.window, a);
  return {a, b - a};
}

// Row-wise causal softmax: row r (query position n − n_q + r % n_q) sees columns 0..n − n_q + r % n_q.
// Masked entries get p = 0 and logp = 0 (so products with them vanish).
template <class T>
void causal_softmax(const RowMat<T>& s, int n_q, RowMat<T>& p, RowMat<T>* logp) {
  const Eigen::Index rows = s.rows(), n = s.cols();
  p.setZero(rows, n);
  if (logp) logp->setZero(rows, n);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const Eigen::Index len = n - n_q + (r % n_q) + 1;
    const T m = s.row(r).head(len).maxCoeff();
    p.row(r).head(len) = (s.row(r).head(len).array() - m).exp();
    const T sum = p.row(r).head(len).sum();
    p.row(r).head(len) /= sum;
    if (logp) logp->row(r).head(len) = s.row(r).head(len).array() - (m + std::log(sum));
  }
}

// Forward of X̂_M = STE(X_M R) Rᵀ over the quantized rows.
template <class T>
struct RotQuant {
  RowMat<T> yhat;   // (m, d) quantized rotated rows
  RowMat<T> xhat;   // (m, d) rotated back
  SteState<T> st;   // STE state used (recorded or replayed)
};

template <class T>
void rot_quant_forward(ConstRowRef<T> xm, const RowMat<T>& r, const SteQuantSpec& spec, SteState<T>* frozen,
                       bool replay, RotQuant<T>& out) {
  RowMat<T> y(xm.rows(), xm.cols());
  gemm<T>(T(1), xm, false, r, false, T(0), y);
  if (replay) {
    out.st = *frozen;
    ste_quant_surrogate(y, out.st, out.yhat);
  } else {
    ste_quant_forward(y, spec, out.yhat, out.st);
    if (frozen) *frozen = out.st;
  }
  out.xhat.resize(xm.rows(), xm.cols());
  gemm<T>(T(1), out.yhat, false, r, true, T(0), out.xhat);
}

// ∂L/∂R from ∂L/∂X̂_M:  dR = dX̂ᵀ Ŷ + X_Mᵀ · STE_backward(dX̂ R).
template <class T>
ColMat<T> rot_quant_backward(ConstRowRef<T> xm, const RowMat<T>& r, const RotQuant<T>& f, const RowMat<T>& dxhat) {
  RowMat<T> dr(r.rows(), r.cols()), dyhat(dxhat.rows(), dxhat.cols()), dy;
  gemm<T>(T(1), dxhat, true, f.yhat, false, T(0), dr);
  gemm<T>(T(1), dxhat, false, r, false, T(0), dyhat);
  ste_quant_backward(f.st, dyhat, dy);
  gemm<T>(T(1), xm, true, dy, false, T(1), dr);
  return dr;
}

// p_q (and log p_q) of the scores with the quantized rows' keys replaced by khat_m.
template <class T>
void quantized_probs(const OptrChunk<T>& c, const OptrLossConfig& cfg, QuantRange qr, const RowMat<T>& khat_m,
                     RowMat<T>& p_q, RowMat<T>* logp_q) {
  RowMat<T> s = c.s_fp;
  if (qr.count > 0) gemm<T>(T(cfg.softmax_scale), c.q, false, khat_m, true, T(0), s.middleCols(qr.begin, qr.count));
  causal_softmax(s, c.n_q, p_q, logp_q);
}

}  // namespace

template <class T>
OptrChunk<T> optr_make_chunk(RowMat<T> q, RowMat<T> k, RowMat<T> v, const std::vector<ColMat<T>>& w_o,
                             const OptrLossConfig& cfg) {
  const int d = int(k.cols()), n = int(k.rows()), g = int(w_o.size());
  check_optr_loss_config(cfg, d);
  KVQ_CHECK(n > 0 && v.rows() == n && v.cols() == d, "OptR chunk: keys are {}x{}, values {}x{}", n, d, v.rows(),
            v.cols());
  KVQ_CHECK(g > 0 && q.cols() == d && q.rows() > 0 && q.rows() % g == 0,
            "OptR chunk: queries are {}x{}, expected (g·n_q)x{} with g = {} W_O slices", q.rows(), q.cols(), d, g);
  OptrChunk<T> c;
  c.g = g;
  c.n_q = int(q.rows()) / g;
  KVQ_CHECK(c.n_q <= n, "OptR chunk: {} query positions but only {} tokens", c.n_q, n);
  c.hidden = int(w_o[0].rows());
  for (int j = 0; j < g; ++j) {
    KVQ_CHECK(w_o[size_t(j)].rows() == c.hidden && w_o[size_t(j)].cols() == d && c.hidden > 0,
              "OptR chunk: W_O slice {} is {}x{}, expected {}x{}", j, w_o[size_t(j)].rows(), w_o[size_t(j)].cols(),
              c.hidden, d);
    c.wo_gram.push_back(w_o[size_t(j)].transpose() * w_o[size_t(j)]);
  }
  KVQ_CHECK(q.allFinite() && k.allFinite() && v.allFinite(), "OptR chunk: non-finite queries, keys or values");
  c.q = std::move(q);
  c.k = std::move(k);
  c.v = std::move(v);
  c.s_fp.resize(c.q.rows(), n);
  c.s_fp.noalias() = T(cfg.softmax_scale) * c.q * c.k.transpose();
  causal_softmax(c.s_fp, c.n_q, c.p_fp, &c.logp_fp);
  c.y_fp.resize(c.q.rows(), d);
  gemm<T>(T(1), c.p_fp, false, c.v, false, T(0), c.y_fp);
  return c;
}

template <class T>
void optr_fix_keys(OptrChunk<T>& c, const OptrLossConfig& cfg, const ColMat<T>& r_k) {
  const QuantRange qr = quant_range(int(c.k.rows()), cfg);
  RotQuant<T> kq;
  if (qr.count > 0)
    rot_quant_forward<T>(c.k.middleRows(qr.begin, qr.count), RowMat<T>(r_k), SteQuantSpec{cfg.bits, cfg.group, cfg.clip_k},
                         nullptr, false, kq);
  quantized_probs<T>(c, cfg, qr, kq.xhat, c.p_q_fixed, nullptr);
  c.fixed_r_k = r_k;
}

template <class T>
double optr_loss(const OptrChunk<T>& c, const OptrLossConfig& cfg, OptrObjective obj, const ColMat<T>& r_k,
                 const ColMat<T>& r_v, std::type_identity_t<OptrGrads<T>>* grads,
                 std::type_identity_t<OptrFrozen<T>>* frozen) {
  using Obj = OptrObjective;
  const int n = int(c.k.rows()), d = int(c.k.cols()), g = c.g, n_q = c.n_q;
  KVQ_CHECK(r_k.rows() == d && r_k.cols() == d && r_v.rows() == d && r_v.cols() == d,
            "optr_loss: rotations are {}x{} and {}x{}, expected {}x{}", r_k.rows(), r_k.cols(), r_v.rows(),
            r_v.cols(), d, d);
  const QuantRange qr = quant_range(n, cfg);
  const bool replay = frozen && frozen->replay;
  const bool uses_k = obj != Obj::kValuePhase, uses_v = obj != Obj::kKeyPhase;
  if (grads) {
    grads->r_k.setZero(d, d);
    grads->r_v.setZero(d, d);
  }
  if (qr.count == 0) return 0.0;  // nothing quantized: every objective is exactly 0
  const auto km = c.k.middleRows(qr.begin, qr.count);
  const auto vm = c.v.middleRows(qr.begin, qr.count);
  const RowMat<T> rk(r_k), rv(r_v);

  // Value phase with cached fixed keys: no key forward needed.
  const bool cached_pq = obj == Obj::kValuePhase && c.p_q_fixed.size() > 0 && !replay && c.fixed_r_k.rows() == d &&
                         c.fixed_r_k == r_k;
  RotQuant<T> kq, vq;
  if (!cached_pq)
    rot_quant_forward<T>(km, rk, SteQuantSpec{cfg.bits, cfg.group, cfg.clip_k}, frozen ? &frozen->k : nullptr,
                         replay, kq);
  if (uses_v)
    rot_quant_forward<T>(vm, rv, SteQuantSpec{cfg.bits, cfg.group, cfg.clip_v}, frozen ? &frozen->v : nullptr,
                         replay, vq);

  if (obj == Obj::kRecon) {
    const double norm = 1.0 / (double(n) * d);
    const RowMat<T> dk = kq.xhat - km, dv = vq.xhat - vm;
    const double loss = norm * (double(dk.squaredNorm()) + double(dv.squaredNorm()));
    if (grads) {
      grads->r_k = rot_quant_backward<T>(km, rk, kq, RowMat<T>(T(2 * norm) * dk));
      grads->r_v = rot_quant_backward<T>(vm, rv, vq, RowMat<T>(T(2 * norm) * dv));
    }
    return loss;
  }

  const bool key_phase = obj == Obj::kKeyPhase;
  RowMat<T> p_q, logp_q;
  if (!cached_pq) quantized_probs(c, cfg, qr, kq.xhat, p_q, key_phase ? &logp_q : nullptr);
  const RowMat<T>& pq = cached_pq ? c.p_q_fixed : p_q;

  // O (g·n_q, d): the pre-W_O output error the objective measures.
  RowMat<T> o(g * n_q, d);
  RowMat<T> dvm;
  if (uses_k) {
    o = -c.y_fp;
    gemm<T>(T(1), pq, false, c.v, false, T(1), o);  // (p_q − p_fp) V = p_q V − y_fp
  } else {
    o.setZero();
  }
  if (uses_v) {
    dvm = vq.xhat - vm;
    gemm<T>(T(1), pq.middleCols(qr.begin, qr.count), false, dvm, false, T(1), o);
  }
  const bool pre_wo = obj == Obj::kPreWo;
  const double out_weight = key_phase ? cfg.lambda_k : 1.0;
  const double coef = out_weight / (double(g) * n_q * (pre_wo ? d : c.hidden));
  RowMat<T> om(g * n_q, d);  // O_j M_j per head block
  for (int j = 0; j < g; ++j) {
    if (pre_wo)
      om.middleRows(j * n_q, n_q) = o.middleRows(j * n_q, n_q);
    else
      om.middleRows(j * n_q, n_q).noalias() = o.middleRows(j * n_q, n_q) * c.wo_gram[size_t(j)];
  }
  double loss = coef * double(o.cwiseProduct(om).sum());
  if (key_phase) loss += double((c.p_fp.array() * (c.logp_fp - logp_q).array()).sum()) / (double(g) * n_q);
  if (!grads) return loss;

  const RowMat<T> d_o = T(2 * coef) * om;  // ∂L/∂O (M_j symmetric)
  if (uses_v) {
    RowMat<T> dvhat(qr.count, d);
    gemm<T>(T(1), pq.middleCols(qr.begin, qr.count), true, d_o, false, T(0), dvhat);
    grads->r_v = rot_quant_backward<T>(vm, rv, vq, dvhat);
  }
  if (uses_k) {
    // ∂L/∂p_q = dO V̂ᵀ (V̂ = V outside the quantized rows), then the softmax backward, plus the KL term.
    RowMat<T> dp(g * n_q, n);
    gemm<T>(T(1), d_o, false, c.v, true, T(0), dp);
    if (uses_v) gemm<T>(T(1), d_o, false, dvm, true, T(1), dp.middleCols(qr.begin, qr.count));
    const Eigen::Matrix<T, Eigen::Dynamic, 1> rowdot = dp.cwiseProduct(pq).rowwise().sum();
    RowMat<T> ds = pq.cwiseProduct(dp - rowdot.replicate(1, n));
    if (key_phase) ds += T(1.0 / (double(g) * n_q)) * (pq - c.p_fp);
    RowMat<T> dkhat(qr.count, d);
    gemm<T>(T(cfg.softmax_scale), ds.middleCols(qr.begin, qr.count), true, c.q, false, T(0), dkhat);
    grads->r_k = rot_quant_backward<T>(km, rk, kq, dkhat);
  }
  return loss;
}

Eigen::MatrixXd optr_grad_a(const SkewExpm& e, const Eigen::MatrixXd& r0, const Eigen::MatrixXd& g_r) {
  return skew_grad(e.adjoint(r0.transpose() * g_r));
}

#define KVQ_OPTR_INSTANTIATE(T)                                                                                   \
  template OptrChunk<T> optr_make_chunk<T>(RowMat<T>, RowMat<T>, RowMat<T>, const std::vector<ColMat<T>>&,          \
                                           const OptrLossConfig&);                                               \
  template void optr_fix_keys<T>(OptrChunk<T>&, const OptrLossConfig&, const ColMat<T>&);                         \
  template double optr_loss<T>(const OptrChunk<T>&, const OptrLossConfig&, OptrObjective, const ColMat<T>&,        \
                               const ColMat<T>&, OptrGrads<T>*, OptrFrozen<T>*);
KVQ_OPTR_INSTANTIATE(float)
KVQ_OPTR_INSTANTIATE(double)
#undef KVQ_OPTR_INSTANTIATE

}  // namespace kvq
