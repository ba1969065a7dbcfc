#include "calib/optr.h"

#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "calib/gemm.h"
#include "common/error.h"

namespace kvq {

const char* optr_mode_name(OptrMode m) {
  switch (m) {
    case OptrMode::kTwoPhase: return "two-phase";
    case OptrMode::kJoint: return "joint";
    case OptrMode::kPreWo: return "pre-wo";
    case OptrMode::kRecon: return "recon";
  }
  return "?";
}

Eigen::MatrixXd optr_rotation(const Eigen::MatrixXd& r0, const Eigen::MatrixXd& a) {
  return r0 * SkewExpm(skew_part(a)).exp();
}

void check_optr_config(const OptrConfig& cfg) {
  KVQ_CHECK(cfg.steps >= 0, "OptR: steps = {} must be >= 0", cfg.steps);
  KVQ_CHECK(cfg.eval_every > 0, "OptR: eval_every = {} must be > 0", cfg.eval_every);
  KVQ_CHECK(cfg.n_threads >= 1 && cfg.n_threads <= 256, "OptR: n_threads = {} must be in 1..256", cfg.n_threads);
  KVQ_CHECK(cfg.adam.lr > 0, "OptR: learning rate {} must be > 0", cfg.adam.lr);
}

namespace {

// Mean loss over chunks, with the mean gradients when g != nullptr.
double mean_loss(const std::vector<OptrChunk<float>>& chunks, const OptrLossConfig& lc, OptrObjective obj,
                 const ColMat<float>& r_k, const ColMat<float>& r_v, OptrGrads<float>* g) {
  double loss = 0;
  OptrGrads<float> one;
  for (size_t i = 0; i < chunks.size(); ++i) {
    loss += optr_loss(chunks[i], lc, obj, r_k, r_v, g ? &one : nullptr);
    if (!g) continue;
    if (i == 0) {
      *g = one;
    } else {
      g->r_k += one.r_k;
      g->r_v += one.r_v;
    }
  }
  if (g) {
    g->r_k /= float(chunks.size());
    g->r_v /= float(chunks.size());
  }
  return loss / double(chunks.size());
}

// One phase: Adam on A_K (learn_k) and/or A_V (learn_v); r_k / r_v hold the fixed rotation of a factor not
// learned and receive the kept rotation of a learned one.
OptrPhaseResult run_phase(OptrHeadInput& h, const OptrConfig& cfg, OptrObjective obj, bool learn_k, bool learn_v,
                          Eigen::MatrixXd& r_k, Eigen::MatrixXd& r_v) {
  const Eigen::Index d = h.r0_k.rows();
  Eigen::MatrixXd a_k = Eigen::MatrixXd::Zero(d, d), a_v = Eigen::MatrixXd::Zero(d, d);
  Adam adam_k(cfg.adam, d, d), adam_v(cfg.adam, d, d);
  OptrPhaseResult res;
  Eigen::MatrixXd best_k = r_k, best_v = r_v;
  double best = 0;
  for (int t = 0; t <= cfg.steps; ++t) {
    const SkewExpm e_k(skew_part(a_k)), e_v(skew_part(a_v));
    const Eigen::MatrixXd cur_k = learn_k ? Eigen::MatrixXd(h.r0_k * e_k.exp()) : r_k;
    const Eigen::MatrixXd cur_v = learn_v ? Eigen::MatrixXd(h.r0_v * e_v.exp()) : r_v;
    const ColMat<float> fk = cur_k.cast<float>(), fv = cur_v.cast<float>();
    if (t % cfg.eval_every == 0 || t == cfg.steps) {
      const double held = mean_loss(h.heldout, cfg.loss, obj, fk, fv, nullptr);
      KVQ_CHECK(std::isfinite(held), "OptR: non-finite held-out loss at step {}", t);
      if (t == 0) {
        res.heldout_before = best = held;
        best_k = cur_k, best_v = cur_v;
      } else if (held < best) {
        best = held, res.best_step = t;
        best_k = cur_k, best_v = cur_v;
      }
    }
    if (t == cfg.steps) break;
    OptrGrads<float> g;
    mean_loss(h.calib, cfg.loss, obj, fk, fv, &g);
    if (learn_k) adam_k.step(a_k, optr_grad_a(e_k, h.r0_k, g.r_k.cast<double>()));
    if (learn_v) adam_v.step(a_v, optr_grad_a(e_v, h.r0_v, g.r_v.cast<double>()));
  }
  res.kept = res.best_step > 0;
  res.heldout_after = best;
  if (learn_k) r_k = best_k;
  if (learn_v) r_v = best_v;
  return res;
}

void check_head(const OptrHeadInput& h, int index) {
  KVQ_CHECK(!h.calib.empty() && !h.heldout.empty(), "OptR head {}: needs calibration and held-out chunks ({} / {})",
            index, h.calib.size(), h.heldout.size());
  const Eigen::Index d = h.calib[0].k.cols();
  KVQ_CHECK(h.r0_k.rows() == d && h.r0_k.cols() == d && h.r0_v.rows() == d && h.r0_v.cols() == d,
            "OptR head {}: base rotations {}x{} / {}x{}, head_dim {}", index, h.r0_k.rows(), h.r0_k.cols(),
            h.r0_v.rows(), h.r0_v.cols(), d);
  const Eigen::MatrixXd id = Eigen::MatrixXd::Identity(d, d);
  KVQ_CHECK((h.r0_k.transpose() * h.r0_k - id).cwiseAbs().maxCoeff() < 1e-6 &&
                (h.r0_v.transpose() * h.r0_v - id).cwiseAbs().maxCoeff() < 1e-6,
            "OptR head {}: base rotation is not orthogonal", index);
  for (const auto* set : {&h.calib, &h.heldout})
    for (const auto& c : *set)
      KVQ_CHECK(c.k.cols() == d, "OptR head {}: chunks of head_dim {} and {}", index, d, c.k.cols());
}

OptrHeadResult calibrate_head(OptrHeadInput& h, const OptrConfig& cfg) {
  Eigen::MatrixXd r_k = h.r0_k, r_v = h.r0_v;
  OptrHeadResult out;
  if (cfg.mode == OptrMode::kTwoPhase) {
    out.key = run_phase(h, cfg, OptrObjective::kKeyPhase, true, false, r_k, r_v);
    const ColMat<float> fk = r_k.cast<float>();
    for (auto* set : {&h.calib, &h.heldout})
      for (auto& c : *set) optr_fix_keys(c, cfg.loss, fk);
    out.value = run_phase(h, cfg, OptrObjective::kValuePhase, false, true, r_k, r_v);
  } else {
    const OptrObjective obj = cfg.mode == OptrMode::kJoint   ? OptrObjective::kJoint
                              : cfg.mode == OptrMode::kPreWo ? OptrObjective::kPreWo
                                                             : OptrObjective::kRecon;
    out.key = out.value = run_phase(h, cfg, obj, true, true, r_k, r_v);
  }
  out.r_k = r_k.cast<float>();
  out.r_v = r_v.cast<float>();
  return out;
}

}  // namespace

std::vector<OptrHeadResult> optr_calibrate_layer(std::vector<OptrHeadInput>& heads, const OptrConfig& cfg) {
  check_optr_config(cfg);
  for (size_t i = 0; i < heads.size(); ++i) {
    check_head(heads[i], int(i));
    check_optr_loss_config(cfg.loss, int(heads[i].r0_k.rows()));
  }
  std::vector<OptrHeadResult> out(heads.size());
  const BlasSingleThreadScope blas_single;  // parallelism is across heads
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  const auto worker = [&] {
    for (size_t i = next++; i < heads.size(); i = next++) {
      try {
        out[i] = calibrate_head(heads[i], cfg);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  const int n_workers = std::min<int>(cfg.n_threads, int(heads.size()));
  if (n_workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int w = 0; w < n_workers; ++w) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace kvq
