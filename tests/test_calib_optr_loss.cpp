// OptR objectives: every analytic gradient (key phase, value phase, joint, pre-wo, recon) against central
// finite differences in A for R = R0·expm(A − Aᵀ), on small random problems in double.
//
// The real quantizer is piecewise constant in A, so finite differences of the real loss are meaningless. The
// checks use the STE surrogate instead: the first evaluation records each group's rounding residuals, clip
// decisions, clip threshold and i_min/i_max (OptrFrozen, replay = false); perturbed evaluations replay them
// (replay = true). The surrogate equals the real loss at the base point and its exact gradient is the STE rule.
#include <random>

#include <gtest/gtest.h>

#include "calib/optr_loss.h"
#include "common/error.h"

using namespace kvq;

namespace {

struct Problem {
  OptrLossConfig cfg;
  OptrChunk<double> chunk;
  std::vector<ColMat<double>> w_o;  // g × (hidden, d)
  Eigen::MatrixXd r0_k, r0_v, a_k, a_v;
};

Eigen::MatrixXd random_orthogonal(int d, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  Eigen::MatrixXd m(d, d);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
  return Eigen::HouseholderQR<Eigen::MatrixXd>(m).householderQ();
}

Problem make_problem(unsigned seed, int window, int d = 32, int n = 96, int g = 2, int n_q = 8, int hidden = 48) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  Problem p;
  p.cfg.bits = 2;
  p.cfg.group = 16;
  p.cfg.sink = 8;
  p.cfg.window = window;
  p.cfg.softmax_scale = 1.0 / std::sqrt(double(d));
  p.cfg.lambda_k = 3.0;
  RowMat<double> q(g * n_q, d), k(n, d), v(n, d);
  for (int i = 0; i < q.size(); ++i) q.data()[i] = 1.5 * nd(rng);
  for (int i = 0; i < k.size(); ++i) k.data()[i] = nd(rng);
  for (int i = 0; i < v.size(); ++i) v.data()[i] = nd(rng);
  k.col(3) *= 6.0;  // outlier channels
  v.col(7) *= 5.0;
  std::vector<ColMat<double>> w_o;
  for (int j = 0; j < g; ++j) {
    ColMat<double> w(hidden, d);
    for (int i = 0; i < w.size(); ++i) w.data()[i] = nd(rng) / std::sqrt(double(d));
    w_o.push_back(w);
  }
  p.chunk = optr_make_chunk(q, k, v, w_o, p.cfg);
  p.w_o = w_o;
  p.r0_k = random_orthogonal(d, rng);
  p.r0_v = random_orthogonal(d, rng);
  p.a_k.resize(d, d);
  p.a_v.resize(d, d);
  for (int i = 0; i < d * d; ++i) p.a_k.data()[i] = 0.05 * nd(rng), p.a_v.data()[i] = 0.05 * nd(rng);
  return p;
}

Eigen::MatrixXd rot(const Eigen::MatrixXd& r0, const Eigen::MatrixXd& a) { return r0 * SkewExpm(skew_part(a)).exp(); }

// Checks ∂L/∂A_K and ∂L/∂A_V along random directions (and on single entries) against central differences of
// the frozen surrogate. Returns the worst relative error.
double check_gradients(Problem& p, OptrObjective obj, bool check_k, bool check_v, unsigned seed) {
  OptrFrozen<double> frozen;
  OptrGrads<double> gr;
  const double base = optr_loss(p.chunk, p.cfg, obj, rot(p.r0_k, p.a_k), rot(p.r0_v, p.a_v), &gr, &frozen);
  frozen.replay = true;
  const double replayed = optr_loss(p.chunk, p.cfg, obj, rot(p.r0_k, p.a_k), rot(p.r0_v, p.a_v), nullptr, &frozen);
  EXPECT_NEAR(replayed, base, 1e-12 * (1 + std::fabs(base))) << "surrogate must equal the real loss at the base";
  EXPECT_GT(base, 0.0);
  const Eigen::MatrixXd ga_k = optr_grad_a(SkewExpm(skew_part(p.a_k)), p.r0_k, gr.r_k);
  const Eigen::MatrixXd ga_v = optr_grad_a(SkewExpm(skew_part(p.a_v)), p.r0_v, gr.r_v);
  if (!check_k) {
    EXPECT_EQ(ga_k.cwiseAbs().maxCoeff(), 0.0);
  }
  if (!check_v) {
    EXPECT_EQ(ga_v.cwiseAbs().maxCoeff(), 0.0);
  }
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  const int d = int(p.a_k.rows());
  double worst = 0;
  const double h = 1e-5;
  for (int which = 0; which < 2; ++which) {
    if ((which == 0 && !check_k) || (which == 1 && !check_v)) continue;
    const Eigen::MatrixXd& ga = which == 0 ? ga_k : ga_v;
    EXPECT_GT(ga.norm(), 0.0);
    for (int trial = 0; trial < 6; ++trial) {
      Eigen::MatrixXd dir = Eigen::MatrixXd::Zero(d, d);
      if (trial < 3) {
        for (int i = 0; i < dir.size(); ++i) dir.data()[i] = nd(rng);
      } else {
        dir(int(rng() % d), int(rng() % d)) = 1.0;  // one entry
      }
      const auto eval = [&](double t) {
        const Eigen::MatrixXd ak = which == 0 ? Eigen::MatrixXd(p.a_k + t * dir) : p.a_k;
        const Eigen::MatrixXd av = which == 1 ? Eigen::MatrixXd(p.a_v + t * dir) : p.a_v;
        return optr_loss(p.chunk, p.cfg, obj, rot(p.r0_k, ak), rot(p.r0_v, av), nullptr, &frozen);
      };
      const double fd = (eval(h) - eval(-h)) / (2 * h);
      const double an = (ga.array() * dir.array()).sum();
      const double rel = std::fabs(fd - an) / std::max(std::fabs(fd), 1e-3 * ga.norm() + 1e-12);
      worst = std::max(worst, rel);
    }
  }
  return worst;
}

}  // namespace

TEST(CalibOptrLoss, KeyPhaseGradientMatchesFiniteDifferences) {
  for (int window : {16, 4}) {  // window 4 < n_q: causally masked keys inside the quantized range
    Problem p = make_problem(11, window);
    EXPECT_LT(check_gradients(p, OptrObjective::kKeyPhase, true, false, 1), 1e-4) << window;
  }
}

TEST(CalibOptrLoss, ValuePhaseGradientMatchesFiniteDifferences) {
  for (int window : {16, 4}) {
    Problem p = make_problem(12, window);
    EXPECT_LT(check_gradients(p, OptrObjective::kValuePhase, false, true, 2), 1e-4) << window;
  }
}

TEST(CalibOptrLoss, JointGradientsForKeysAndValuesMatchFiniteDifferences) {
  for (int window : {16, 4}) {
    Problem p = make_problem(13, window);
    EXPECT_LT(check_gradients(p, OptrObjective::kJoint, true, true, 3), 1e-4) << window;
  }
}

TEST(CalibOptrLoss, PreWoGradientsMatchFiniteDifferences) {
  Problem p = make_problem(14, 16);
  EXPECT_LT(check_gradients(p, OptrObjective::kPreWo, true, true, 4), 1e-4);
}

TEST(CalibOptrLoss, ReconGradientsMatchFiniteDifferences) {
  Problem p = make_problem(15, 16);
  EXPECT_LT(check_gradients(p, OptrObjective::kRecon, true, true, 5), 1e-4);
}

TEST(CalibOptrLoss, ValuePhaseWithCachedFixedKeysEqualsRecomputed) {
  Problem p = make_problem(16, 16);
  const Eigen::MatrixXd rk = rot(p.r0_k, p.a_k), rv = rot(p.r0_v, p.a_v);
  OptrGrads<double> g1, g2;
  const double l1 = optr_loss(p.chunk, p.cfg, OptrObjective::kValuePhase, rk, rv, &g1);
  optr_fix_keys(p.chunk, p.cfg, ColMat<double>(rk));
  const double l2 = optr_loss(p.chunk, p.cfg, OptrObjective::kValuePhase, rk, rv, &g2);
  EXPECT_NEAR(l1, l2, 1e-14 * l1);
  EXPECT_LT((g1.r_v - g2.r_v).cwiseAbs().maxCoeff(), 1e-12 * g1.r_v.cwiseAbs().maxCoeff());
}

TEST(CalibOptrLoss, AllObjectivesVanishWhenNothingIsQuantized) {
  Problem p = make_problem(17, 16);
  OptrLossConfig none = p.cfg;
  none.sink = 48, none.window = 48;  // 48 + 48 >= n = 96
  const Eigen::MatrixXd id = Eigen::MatrixXd::Identity(32, 32);
  for (auto obj : {OptrObjective::kKeyPhase, OptrObjective::kValuePhase, OptrObjective::kJoint, OptrObjective::kPreWo,
                   OptrObjective::kRecon}) {
    OptrGrads<double> gr;
    EXPECT_EQ(optr_loss(p.chunk, none, obj, id, id, &gr), 0.0) << optr_objective_name(obj);
    EXPECT_EQ(gr.r_k.cwiseAbs().maxCoeff() + gr.r_v.cwiseAbs().maxCoeff(), 0.0);
  }
}

TEST(CalibOptrLoss, LossesEqualScalarReferenceWithExplicitWo) {
  // Scalar twin of the spec: quantize the middle tokens through the rotations, causal attention per query
  // head, then the key-phase loss (KL + λ·post-W_O output error, values exact) and the joint Δy loss, using
  // W_O itself (not its Gram matrix).
  Problem p = make_problem(20, 4);
  const auto& c = p.chunk;
  const int n = 96, d = 32, g = 2, n_q = 8, hidden = 48, a = p.cfg.sink, b = n - p.cfg.window;
  const Eigen::MatrixXd rk = rot(p.r0_k, p.a_k), rv = rot(p.r0_v, p.a_v);
  const auto quantize = [&](const RowMat<double>& x, const Eigen::MatrixXd& r, float clip) {
    RowMat<double> y = x.middleRows(a, b - a) * r, yhat, out = x;
    SteState<double> st;
    ste_quant_forward(y, SteQuantSpec{p.cfg.bits, p.cfg.group, clip}, yhat, st);
    out.middleRows(a, b - a) = yhat * r.transpose();
    return out;
  };
  const RowMat<double> khat = quantize(c.k, rk, p.cfg.clip_k), vhat = quantize(c.v, rv, p.cfg.clip_v);
  double kl = 0, out_k = 0, out_joint = 0;
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n_q; ++i) {
      const int pos = n - n_q + i;
      std::vector<double> sf(pos + 1), sq(pos + 1);
      double mf = -1e300, mq = -1e300;
      for (int t = 0; t <= pos; ++t) {
        sf[t] = p.cfg.softmax_scale * c.q.row(j * n_q + i).dot(c.k.row(t));
        sq[t] = p.cfg.softmax_scale * c.q.row(j * n_q + i).dot(khat.row(t));
        mf = std::max(mf, sf[t]), mq = std::max(mq, sq[t]);
      }
      double zf = 0, zq = 0;
      for (int t = 0; t <= pos; ++t) zf += std::exp(sf[t] - mf), zq += std::exp(sq[t] - mq);
      Eigen::RowVectorXd dk = Eigen::RowVectorXd::Zero(d), dj = Eigen::RowVectorXd::Zero(d);
      for (int t = 0; t <= pos; ++t) {
        const double pf = std::exp(sf[t] - mf) / zf, pq = std::exp(sq[t] - mq) / zq;
        kl += pf * (std::log(pf) - std::log(pq));
        dk += (pq - pf) * c.v.row(t);
        dj += pq * vhat.row(t) - pf * c.v.row(t);
      }
      out_k += (dk * p.w_o[size_t(j)].transpose()).squaredNorm();
      out_joint += (dj * p.w_o[size_t(j)].transpose()).squaredNorm();
    }
  const double want_key = kl / (g * n_q) + p.cfg.lambda_k * out_k / (double(g) * n_q * hidden);
  const double want_joint = out_joint / (double(g) * n_q * hidden);
  EXPECT_NEAR(optr_loss(c, p.cfg, OptrObjective::kKeyPhase, rk, rv, nullptr), want_key, 1e-12 * want_key);
  EXPECT_NEAR(optr_loss(c, p.cfg, OptrObjective::kJoint, rk, rv, nullptr), want_joint, 1e-12 * want_joint);
  const double want_recon = ((khat - c.k).squaredNorm() + (vhat - c.v).squaredNorm()) / (n * d);
  EXPECT_NEAR(optr_loss(c, p.cfg, OptrObjective::kRecon, rk, rv, nullptr), want_recon, 1e-12 * want_recon);
}

TEST(CalibOptrLoss, FloatPathAgreesWithDouble) {
  Problem p = make_problem(18, 16);
  const Eigen::MatrixXd rk = rot(p.r0_k, p.a_k), rv = rot(p.r0_v, p.a_v);
  std::vector<ColMat<float>> wo;
  for (const auto& w : p.w_o) wo.push_back(w.cast<float>());
  const OptrChunk<float> cf =
      optr_make_chunk<float>(p.chunk.q.cast<float>(), p.chunk.k.cast<float>(), p.chunk.v.cast<float>(), wo, p.cfg);
  for (auto obj : {OptrObjective::kKeyPhase, OptrObjective::kValuePhase, OptrObjective::kJoint}) {
    OptrGrads<double> gd;
    OptrGrads<float> gf;
    const double ld = optr_loss(p.chunk, p.cfg, obj, rk, rv, &gd);
    const double lf = optr_loss(cf, p.cfg, obj, ColMat<float>(rk.cast<float>()), ColMat<float>(rv.cast<float>()), &gf);
    EXPECT_NEAR(lf, ld, 1e-4 * ld) << optr_objective_name(obj);
    EXPECT_LE((gf.r_k.cast<double>() - gd.r_k).norm(), 1e-3 * gd.r_k.norm()) << optr_objective_name(obj);
    EXPECT_LE((gf.r_v.cast<double>() - gd.r_v).norm(), 1e-3 * gd.r_v.norm()) << optr_objective_name(obj);
  }
}

TEST(CalibOptrLoss, RejectsBadShapesAndConfig) {
  Problem p = make_problem(19, 16);
  OptrLossConfig bad = p.cfg;
  bad.softmax_scale = 0;
  std::vector<ColMat<double>> wo(2, ColMat<double>::Zero(48, 32));
  EXPECT_THROW(optr_make_chunk<double>(p.chunk.q, p.chunk.k, p.chunk.v, wo, bad), Error);
  EXPECT_THROW(optr_make_chunk<double>(p.chunk.q, p.chunk.k, RowMat<double>::Zero(95, 32), wo, p.cfg), Error);
  std::vector<ColMat<double>> wo3(3, ColMat<double>::Zero(48, 32));
  EXPECT_THROW(optr_make_chunk<double>(p.chunk.q, p.chunk.k, p.chunk.v, wo3, p.cfg), Error);  // 16 rows, g = 3
  const Eigen::MatrixXd id = Eigen::MatrixXd::Identity(16, 16);
  EXPECT_THROW(optr_loss(p.chunk, p.cfg, OptrObjective::kJoint, id, id, nullptr), Error);
}
