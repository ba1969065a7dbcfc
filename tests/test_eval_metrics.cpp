// Evaluation metric functions against hand-computed cases: ppl from NLLs, KL from logits, top-1, the bootstrap
// (fixed seed) and the Wilson interval's closed form.
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "eval/bootstrap.h"
#include "eval/layer_errors.h"
#include "eval/metrics.h"
#include "eval/perplexity.h"
#include "eval/rng.h"

using namespace kvq;

TEST(EvalMetrics, PplFromNllIsExpOfMeanNll) {
  EXPECT_NEAR(ppl_from_nll(3 * std::log(4.0), 3), 4.0, 1e-12);
  EXPECT_NEAR(ppl_from_nll(0.0, 10), 1.0, 0.0);
  EXPECT_THROW(ppl_from_nll(1.0, 0), Error);
}

TEST(EvalMetrics, KlOfKnownDistributionsFromShiftedLogits) {
  // p = (1/2, 1/4, 1/4), q = (1/4, 1/4, 1/2): KL(p‖q) = 1/2 ln 2 + 0 + 1/4 ln(1/2) = ln(2) / 4.
  // Logits are log-probabilities plus arbitrary constants (softmax is shift invariant).
  const float p[3] = {float(std::log(0.5) + 3), float(std::log(0.25) + 3), float(std::log(0.25) + 3)};
  const float q[3] = {float(std::log(0.25) - 1), float(std::log(0.25) - 1), float(std::log(0.5) - 1)};
  EXPECT_NEAR(kl_from_logits(p, q, 3), std::log(2.0) / 4, 1e-7);
  // Reverse direction: KL(q‖p) = 1/4 ln(1/2) + 0 + 1/2 ln 2 = ln(2) / 4 as well (symmetric example), and
  // a non-symmetric one: p = (0.9, 0.1), q = (0.5, 0.5): 0.9 ln 1.8 + 0.1 ln 0.2.
  const float a[2] = {float(std::log(0.9)), float(std::log(0.1))};
  const float b[2] = {0.f, 0.f};
  EXPECT_NEAR(kl_from_logits(a, b, 2), 0.9 * std::log(1.8) + 0.1 * std::log(0.2), 1e-7);
  EXPECT_NEAR(kl_from_logits(b, a, 2), 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1), 1e-7);
}

TEST(EvalMetrics, KlOfIdenticalLogitsIsExactlyZero) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.37) * 7);
  EXPECT_EQ(kl_from_logits(x.data(), x.data(), int(x.size())), 0.0);
}

TEST(EvalMetrics, ArgmaxTakesTheFirstMaximumAndLogSoftmaxNormalises) {
  const float x[5] = {1.f, 3.f, -2.f, 3.f, 0.f};
  EXPECT_EQ(argmax(x, 5), 1);
  double ls[5];
  log_softmax(x, 5, ls);
  double s = 0;
  for (double v : ls) s += std::exp(v);
  EXPECT_NEAR(s, 1.0, 1e-14);
  EXPECT_NEAR(ls[1] - ls[0], 2.0, 1e-14);
}

// The lockstep's one-pass row comparison: the NLLs bit for bit token_nll's (so lockstep ppl equals eval::perplexity),
// KL within rounding of a two-pass log-softmax reference, top-1 agreement as two argmaxes.
TEST(EvalMetrics, RowFidelityMatchesTokenNllKlAndArgmaxOfTheSameRows) {
  const int V = 777;
  std::vector<float> p(V), q(V);
  for (int i = 0; i < V; ++i) {
    p[size_t(i)] = float(std::sin(i * 0.37) * 6 + std::cos(i * 1.3));
    q[size_t(i)] = p[size_t(i)] + float(0.3 * std::sin(i * 2.1));
  }
  std::vector<double> scratch(V), lp(V), lq(V);
  for (int32_t target : {0, 5, V - 1}) {
    const RowFidelity r = row_fidelity(p.data(), q.data(), V, target, scratch.data());
    EXPECT_EQ(r.nll_p, token_nll(p.data(), V, target));
    EXPECT_EQ(r.nll_q, token_nll(q.data(), V, target));
    log_softmax(p.data(), V, lp.data());
    log_softmax(q.data(), V, lq.data());
    double kl = 0;
    for (int i = 0; i < V; ++i) kl += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
    EXPECT_GT(kl, 1e-3);
    EXPECT_NEAR(r.kl, kl, 1e-12 * kl + 1e-15);
    EXPECT_EQ(r.top1_agree, argmax(p.data(), V) == argmax(q.data(), V));
  }
  const RowFidelity none = row_fidelity(p.data(), q.data(), V, -1, scratch.data());
  EXPECT_EQ(none.nll_p, 0.0);
  q[size_t(argmax(p.data(), V))] += 100.f;  // q's argmax moves elsewhere unless it already was there
  q[0] += 200.f;
  EXPECT_FALSE(row_fidelity(p.data(), q.data(), V, -1, scratch.data()).top1_agree || argmax(p.data(), V) == 0);
  EXPECT_THROW(row_fidelity(p.data(), q.data(), V, V, scratch.data()), Error);
}

TEST(EvalMetrics, RelativeErrorFromSquaredNorms) {
  EXPECT_DOUBLE_EQ(relative_error(4.0, 16.0), 0.5);
  EXPECT_EQ(relative_error(0.0, 0.0), 0.0);
  EXPECT_TRUE(std::isinf(relative_error(1.0, 0.0)));
}

TEST(EvalBootstrap, MeanOfOneToTenCoversTheMeanAndIsSeeded) {
  std::vector<double> x(10), ones(10, 1.0);
  std::iota(x.begin(), x.end(), 1.0);
  const BootstrapResult r = bootstrap_ratio(x, ones, 4000, 7);
  EXPECT_DOUBLE_EQ(r.ci.estimate, 5.5);
  // The bootstrap distribution of the mean is centred on the sample mean (its SE over 4000 resamples is ~0.015).
  EXPECT_NEAR(r.boot_mean, 5.5, 0.08);
  EXPECT_LT(r.ci.lo, 5.5);
  EXPECT_GT(r.ci.hi, 5.5);
  // Width ≈ 2 · 1.96 · σ/√n with the plug-in σ = √8.25 = 2.872: ≈ 3.56.
  EXPECT_NEAR(r.ci.hi - r.ci.lo, 3.56, 0.4);
  const BootstrapResult again = bootstrap_ratio(x, ones, 4000, 7);
  EXPECT_EQ(again.ci.lo, r.ci.lo);
  EXPECT_EQ(again.ci.hi, r.ci.hi);
  const BootstrapResult other = bootstrap_ratio(x, ones, 4000, 8);
  EXPECT_NE(other.boot_mean, r.boot_mean);
}

TEST(EvalBootstrap, RatioOfSumsWeighsUnitsByDenominator) {
  // Σnum / Σden = (2 + 9) / (1 + 3) = 2.75; a constant per-unit ratio gives a degenerate interval.
  const BootstrapResult r = bootstrap_ratio({2.0, 9.0}, {1.0, 3.0}, 200, 1);
  EXPECT_DOUBLE_EQ(r.ci.estimate, 2.75);
  EXPECT_GE(r.ci.lo, 2.0);
  EXPECT_LE(r.ci.hi, 3.0);
  const BootstrapResult c = bootstrap_ratio({3.0, 6.0, 9.0}, {1.0, 2.0, 3.0}, 100, 3);
  EXPECT_DOUBLE_EQ(c.ci.lo, 3.0);
  EXPECT_DOUBLE_EQ(c.ci.hi, 3.0);
  EXPECT_THROW(bootstrap_ratio({}, {}, 10, 0), Error);
  EXPECT_THROW(bootstrap_ratio({1.0}, {1.0, 2.0}, 10, 0), Error);
}

TEST(EvalBootstrap, WilsonIntervalClosedForm) {
  EXPECT_NEAR(normal_quantile_two_sided(0.95), 1.959963984540054, 1e-12);
  // 8 of 10: p = 0.8, z² / n = 0.384146; centre 0.716737, half-width 0.226578.
  const Interval w = wilson_interval(8, 10);
  EXPECT_DOUBLE_EQ(w.estimate, 0.8);
  EXPECT_NEAR(w.lo, 0.4901625, 1e-6);
  EXPECT_NEAR(w.hi, 0.9433178, 1e-6);
  // 0 of 10: [0, (z²/n) / (1 + z²/n)] = [0, 0.277533]; n of n mirrors it.
  const Interval z = wilson_interval(0, 10);
  EXPECT_DOUBLE_EQ(z.lo, 0.0);
  EXPECT_NEAR(z.hi, 0.384146 / 1.384146, 1e-5);
  const Interval all = wilson_interval(10, 10);
  EXPECT_NEAR(all.lo, 1 - z.hi, 1e-12);
  EXPECT_DOUBLE_EQ(all.hi, 1.0);
  EXPECT_THROW(wilson_interval(3, 0), Error);
  EXPECT_THROW(wilson_interval(4, 3), Error);
}

TEST(EvalRng, UniformIntStaysInRangeAndIsSeedDeterministic) {
  EvalRng a(42), b(42);
  int lo_seen = 0, hi_seen = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t x = a.uniform_int(3, 7);
    EXPECT_EQ(x, b.uniform_int(3, 7));
    ASSERT_GE(x, 3);
    ASSERT_LE(x, 7);
    lo_seen += x == 3;
    hi_seen += x == 7;
  }
  EXPECT_GT(lo_seen, 300);  // ~400 expected each
  EXPECT_GT(hi_seen, 300);
  EXPECT_NE(mix_seed(1, 2048), mix_seed(1, 4096));
  EXPECT_EQ(mix_seed(1, 2048), mix_seed(1, 2048));
}

TEST(EvalLayerErrors, ForcedRecorderCopiesTheReferenceInputAndSumsGiveRelativeErrors) {
  // One layer, hidden 2, one token. Reference: input (1, 2), y = (3, 4), h = (0, 2).
  LayerRecorder ref(1, 2), free(1, 2);
  LayerRecorder forced(1, 2, &ref);
  float x_ref[2] = {1, 2}, y_ref[2] = {3, 4}, h_ref[2] = {0, 2};
  ref.on_layer_input(0, 0, 1, x_ref);
  ref.on_attention_output(0, 0, 1, y_ref);
  ref.on_layer_output(0, 0, 1, h_ref);
  float x_forced[2] = {9, 9};  // the method's own input is replaced by the reference's
  forced.on_layer_input(0, 0, 1, x_forced);
  EXPECT_EQ(x_forced[0], 1.f);
  EXPECT_EQ(x_forced[1], 2.f);
  const float y_forced[2] = {3, 5}, h_forced[2] = {7, 7};
  forced.on_attention_output(0, 0, 1, y_forced);
  forced.on_layer_output(0, 0, 1, h_forced);
  float x_free[2] = {1, 3};
  const float y_free[2] = {6, 8}, h_free[2] = {0, 1};
  free.on_layer_input(0, 0, 1, x_free);
  EXPECT_EQ(x_free[1], 3.f);  // a recorder without a source leaves the input alone
  free.on_attention_output(0, 0, 1, y_free);
  free.on_layer_output(0, 0, 1, h_free);
  LayerErrorSums s(1);
  s.add(ref, forced, free, 1);
  EXPECT_DOUBLE_EQ(s.attn_local(0), 1.0 / 5.0);  // ‖(0, 1)‖ / ‖(3, 4)‖
  EXPECT_DOUBLE_EQ(s.attn_e2e(0), 1.0);           // ‖(3, 4)‖ / ‖(3, 4)‖
  EXPECT_DOUBLE_EQ(s.hidden(0), 0.5);             // ‖(0, -1)‖ / ‖(0, 2)‖
  LayerErrorSums twice(1);
  twice.merge(s);
  twice.merge(s);
  EXPECT_EQ(twice.tokens, 2);
  EXPECT_DOUBLE_EQ(twice.attn_local(0), 0.2);  // ratios of pooled sums are unchanged by duplication
}
