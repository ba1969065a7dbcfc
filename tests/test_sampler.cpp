// The sampler (model/sampler.h): logit bias and the repetition penalties against values computed by hand, greedy on
// the penalised logits, min-p's cut, sampling without a full sort of the vocabulary against a reference that sorts
// everything (the same seeded draw must pick the same token), the top_k largest alone against the whole row, and the
// Gumbel-max draw of temperature sampling (model/gumbel.h) against the softmax's frequencies and libm's logarithm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "common/error.h"
#include "model/gumbel.h"
#include "model/sampler.h"

using namespace kvq;

TEST(Sampler, BiasAndPenaltiesMatchAHandComputedReference) {
  SamplerConfig c{.temperature = 0, .presence_penalty = 0.5f, .frequency_penalty = 0.25f, .repetition_penalty = 1.5f,
                  .logit_bias = {{0, -1.0f}, {4, 2.0f}}};
  Sampler s(c);
  const int32_t prompt[] = {1, 2};
  s.observe_prompt(prompt, 2);
  for (int32_t id : {3, 3, 5}) s.observe(id);  // generated: 3 twice, 5 once
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f};
  s.apply_penalties(l.data(), 6);
  // bias: l0 = 2 - 1, l4 = -0.5 + 2; repetition over {1, 2, 3, 5}: negative * 1.5, positive / 1.5;
  // then l3 -= 0.25 * 2 + 0.5, l5 -= 0.25 * 1 + 0.5.
  const std::vector<float> want = {1.0f, -1.5f, 0.5f / 1.5f, 3.0f / 1.5f - 1.0f, 1.5f, 1.0f / 1.5f - 0.75f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(l[size_t(i)], want[size_t(i)]) << "token " << i;
  // Greedy chooses on the penalised logits: token 4 (1.5), not the raw argmax 3.
  const std::vector<float> raw = {2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f};
  EXPECT_EQ(s.sample(raw.data(), 6), 4);
  EXPECT_TRUE(c.transforms_logits());
  EXPECT_FALSE(SamplerConfig{}.transforms_logits());
}

TEST(Sampler, OutOfRangeSettingsAreRefused) {
  EXPECT_THROW(Sampler(SamplerConfig{.min_p = 1.5f}), Error);
  EXPECT_THROW(Sampler(SamplerConfig{.repetition_penalty = 0.f}), Error);
  EXPECT_THROW(Sampler(SamplerConfig{.logit_bias = {{-1, 1.f}}}), Error);
  EXPECT_THROW(Sampler(SamplerConfig{.presence_penalty = NAN}), Error);
}

TEST(Sampler, MinPKeepsOnlyTokensAboveItsFractionOfTheLargest) {
  // Probabilities at temperature 1 proportional to exp(l): 1, e^-1 (0.37), e^-2 (0.14), e^-5 ...
  const std::vector<float> l = {0.f, -1.f, -2.f, -5.f, -5.f, -6.f};
  Sampler s(SamplerConfig{.temperature = 1.f, .top_k = 0, .top_p = 1.f, .seed = 3, .min_p = 0.3f});
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l.data(), 6));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));  // 0.37 >= 0.3 x 1; 0.14 is not
}

namespace {

// The reference: a full sort by (logit desc, id asc), then the same steps and the same draw as model/sampler.h.
int32_t reference_sample(const std::vector<float>& logits, const SamplerConfig& c, std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> cand;
  for (size_t i = 0; i < logits.size(); ++i) cand.push_back({logits[i], int32_t(i)});
  const float mx = *std::max_element(logits.begin(), logits.end());
  double total = 0;  // in id order, in smath's blocks (model/sampling_math.h), as the sampler does without top_k
  std::vector<double> p(logits.size());
  size_t above = 0;
  const size_t block = size_t(smath::sum_block(int64_t(logits.size())));
  for (size_t b0 = 0; b0 < logits.size(); b0 += block) {
    double part = 0;
    for (size_t i = b0; i < std::min(logits.size(), b0 + block); ++i) {
      part += (p[i] = smath::weight(logits[i], mx, double(c.temperature)));
      above += p[i] >= double(c.min_p);
    }
    total += part;
  }
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = cand.size();
  double mass = total;
  if (c.top_p < 1.f) {
    double cum = 0;
    for (keep = 0; keep < cand.size();) {
      cum += p[size_t(cand[keep++].second)];
      if (cum / total >= c.top_p) break;
    }
    mass = cum;
  }
  if (above < keep) {
    keep = above;
    mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += p[size_t(cand[i].second)];
  }
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng);
  for (size_t i = 0; i < keep; ++i)
    if ((r -= p[size_t(cand[i].second)]) <= 0) return cand[i].second;
  return cand[keep - 1].second;
}

}  // namespace

TEST(Sampler, PartialOrderingDrawsTheSameTokensAsAFullSort) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  // (top_p 1 with min_p 0 draws by the Gumbel-max trick: TemperatureAloneDrawsAtTheSoftmaxFrequencies)
  for (const auto& [top_p, min_p] : std::vector<std::pair<float, float>>{{0.9f, 0.f}, {0.5f, 0.f}, {1.f, 0.05f},
                                                                         {0.95f, 0.01f}}) {
    const SamplerConfig c{.temperature = 0.8f, .top_k = 0, .top_p = top_p, .seed = 17, .min_p = min_p};
    Sampler s(c);
    std::mt19937_64 rng(c.seed);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> logits(5000);
      for (float& x : logits) x = normal(gen);
      ASSERT_EQ(s.sample(logits.data(), 5000), reference_sample(logits, c, rng))
          << "top_p " << top_p << " min_p " << min_p << " step " << step;
    }
  }
}

TEST(Sampler, TopKDrawsOnlyAmongTheKLargest) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  Sampler s(SamplerConfig{.temperature = 1.5f, .top_k = 7, .top_p = 1.f, .seed = 2});
  std::set<int32_t> drawn;
  std::vector<float> logits(3000);
  for (float& x : logits) x = normal(gen);
  std::vector<int32_t> order(3000);
  for (int i = 0; i < 3000; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const std::set<int32_t> top7(order.begin(), order.begin() + 7);
  for (int i = 0; i < 500; ++i) drawn.insert(s.sample(logits.data(), 3000));
  EXPECT_EQ(drawn, top7);  // every one of the 7 drawn in 500 tries at temperature 1.5, nothing else
}

namespace {

// The n first of a row in the sampler's order (logit desc, id asc) by a full sort: what Runner::top_logits returns.
void top_of(const std::vector<float>& logits, int n, std::vector<int32_t>& ids, std::vector<float>& vals) {
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  ids.assign(order.begin(), order.begin() + n);
  vals.clear();
  for (int32_t id : ids) vals.push_back(logits[size_t(id)]);
}

}  // namespace

TEST(Sampler, TheTopKLargestAloneDrawTheSameTokensAsTheWholeRow) {
  std::mt19937 gen(23);
  std::normal_distribution<float> normal(0.f, 2.f);
  const int V = 6000;
  for (const int top_k : {1, 7, 40, 256, 1024})
    for (const auto& [top_p, min_p] : std::vector<std::pair<float, float>>{{1.f, 0.f}, {0.9f, 0.f}, {0.95f, 0.02f}}) {
      const SamplerConfig c{.temperature = 0.7f, .top_k = top_k, .top_p = top_p, .seed = 29, .min_p = min_p};
      Sampler whole(c), top(c);
      ASSERT_EQ(top.top_candidates(V), top_k);
      std::vector<int32_t> ids;
      std::vector<float> vals;
      for (int step = 0; step < 60; ++step) {
        std::vector<float> logits(V);
        // Every other step on a coarse grid, so that equal logits are common and the ids order them.
        for (float& x : logits) x = step % 2 ? std::round(normal(gen) * 4.f) / 4.f : normal(gen);
        if (step % 3 == 0) logits[size_t(step)] = -0.f, logits[size_t(step) + 1] = 0.f;
        top_of(logits, top_k + step % 5, ids, vals);  // more candidates than top_k are fine
        ASSERT_EQ(top.sample_top(ids.data(), vals.data(), int(ids.size()), V), whole.sample(logits.data(), V))
            << "top_k " << top_k << " top_p " << top_p << " min_p " << min_p << " step " << step;
      }
    }
}

TEST(Sampler, TheWholeRowIsNeededWhereTheTopKDoNotDecide) {
  const int V = 5000;
  EXPECT_EQ(Sampler(SamplerConfig{.top_k = 40}).top_candidates(V), 40);
  EXPECT_EQ(Sampler(SamplerConfig{.temperature = 0.f, .top_k = 40}).top_candidates(V), 0);  // greedy: the argmax
  EXPECT_FALSE(Sampler(SamplerConfig{.top_k = 40}).needs_row_mass(V));
  // top_p over the whole vocabulary: the kMaxSortedTopK largest and the row's mass
  for (const int k : {0, V}) {
    EXPECT_EQ(Sampler(SamplerConfig{.top_k = k}).top_candidates(V), kMaxSortedTopK);
    EXPECT_TRUE(Sampler(SamplerConfig{.top_k = k}).needs_row_mass(V));
  }
  EXPECT_EQ(Sampler(SamplerConfig{.top_k = 0, .top_p = 1.f}).top_candidates(V), 0);  // Gumbel-max: its own draw
  EXPECT_EQ(Sampler(SamplerConfig{.top_k = kMaxSortedTopK + 1}).top_candidates(V), 0);
  EXPECT_EQ(Sampler(SamplerConfig{.top_k = 40, .presence_penalty = 0.5f}).top_candidates(V), 0);
  EXPECT_EQ(Sampler(SamplerConfig{.top_k = 40, .logit_bias = {{3, 1.f}}}).top_candidates(V), 0);
  Sampler s(SamplerConfig{.top_k = 40});
  const std::vector<int32_t> ids(39, 0);
  const std::vector<float> vals(39, 0.f);
  EXPECT_THROW(s.sample_top(ids.data(), vals.data(), 39, V), Error);  // fewer candidates than top_k
}

TEST(Gumbel, TheLogarithmIsWithinOneUlpOfLibms) {
  std::mt19937_64 gen(5);
  const auto ulps = [](double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, 8), std::memcpy(&ib, &b, 8);
    return ia > ib ? ia - ib : ib - ia;  // same sign (both logs of the same x)
  };
  for (int i = 0; i < 200000; ++i) {
    // the noise's two logarithms: of a uniform in (0, 1), and of -log of it, in (2^-54, 38)
    const double u = gumbel::uniform(gen(), uint64_t(i));
    const double e = -std::log(u);
    for (const double x : {u, e, 1.0 + 1e-9 * double(i % 7), 1.0 - 1e-12 * double(i % 5 + 1)}) {
      if (x == 1.0) continue;
      ASSERT_LE(ulps(smath::log_exact(x), std::log(x)), 1)
          << "x " << std::hexfloat << x << ": " << smath::log_exact(x) << " against " << std::log(x);
    }
  }
  EXPECT_EQ(smath::log_exact(1.0), 0.0);
}

TEST(Sampler, TemperatureAloneDrawsAtTheSoftmaxFrequencies) {
  const std::vector<float> l = {0.f, -1.f, -2.f, -0.5f, -3.f};
  const float t = 0.8f;
  Sampler s(SamplerConfig{.temperature = t, .top_k = 0, .top_p = 1.f, .seed = 123});
  ASSERT_TRUE(s.draws_by_gumbel(5));
  EXPECT_FALSE(Sampler(SamplerConfig{.top_k = 40, .top_p = 1.f}).draws_by_gumbel(5000));
  EXPECT_TRUE(Sampler(SamplerConfig{.top_k = 40, .top_p = 1.f}).draws_by_gumbel(40));  // top_k >= vocab: no cut
  EXPECT_FALSE(Sampler(SamplerConfig{.top_k = 0, .top_p = 0.9f}).draws_by_gumbel(5000));
  EXPECT_FALSE(Sampler(SamplerConfig{.top_k = 0, .top_p = 1.f, .min_p = 0.1f}).draws_by_gumbel(5000));
  const int n = 40000;
  std::vector<int> count(5, 0);
  for (int i = 0; i < n; ++i) ++count[size_t(s.sample(l.data(), 5))];
  double z = 0;
  for (float x : l) z += std::exp(double(x) / t);
  for (int i = 0; i < 5; ++i) {
    const double p = std::exp(double(l[size_t(i)]) / t) / z, sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(double(count[size_t(i)]) / n, p, 5 * sigma) << "token " << i;
  }
  // Seeded: the same draws again from the same seed, and a draw's token from its base alone.
  const SamplerConfig c{.temperature = t, .top_k = 0, .top_p = 1.f, .seed = 9};
  Sampler a(c), b(c);
  for (int i = 0; i < 100; ++i) {
    const uint64_t base = b.gumbel_base();
    int32_t best = 0;
    for (int j = 1; j < 5; ++j)
      if (gumbel::score(l[size_t(j)], t, base, uint64_t(j)) > gumbel::score(l[size_t(best)], t, base, uint64_t(best)))
        best = j;
    ASSERT_EQ(a.sample(l.data(), 5), b.take_gumbel(best)) << "draw " << i;
  }
}

TEST(Sampler, ANucleusWithinTheLargestLogitsIsDrawnFromThemAndTheRowsMass) {
  // top_p / min_p over the whole vocabulary from the 1024 largest logits and the row's mass (what the GPU returns):
  // the whole row's token where the nucleus lies within them, else -1 and nothing drawn (the next draw is unchanged).
  std::mt19937 gen(31);
  const int V = 20000;
  int decided = 0, undecided = 0;
  for (const auto& [top_p, min_p] : std::vector<std::pair<float, float>>{{0.9f, 0.f}, {0.95f, 0.02f}, {1.f, 0.05f}}) {
    const SamplerConfig c{.temperature = 0.8f, .top_k = 0, .top_p = top_p, .seed = 5, .min_p = min_p};
    Sampler whole(c), top(c);
    ASSERT_TRUE(top.needs_row_mass(V));
    const int k = top.top_candidates(V);
    std::vector<int32_t> ids;
    std::vector<float> vals;
    for (int step = 0; step < 40; ++step) {
      // peaked rows (a trained model's) and, every fourth step, flat ones whose nucleus is most of the vocabulary
      std::normal_distribution<float> normal(0.f, step % 4 == 3 ? 0.3f : 4.f);
      std::vector<float> logits(V);
      for (float& x : logits) x = normal(gen);
      if (step % 2) logits[size_t(step)] = -0.f, logits[size_t(step) + 1] = 0.f;
      const float mx = *std::max_element(logits.begin(), logits.end());
      smath::RowMass mass{0.0, 0};
      const int64_t block = smath::sum_block(V);
      for (int64_t b0 = 0; b0 < V; b0 += block) {
        double part = 0;
        for (int64_t i = b0; i < std::min<int64_t>(V, b0 + block); ++i) {
          const double p = smath::weight(logits[size_t(i)], mx, double(c.temperature));
          part += p;
          mass.above_min_p += p >= double(c.min_p);
        }
        mass.total += part;
      }
      top_of(logits, k, ids, vals);
      int32_t got = top.sample_top(ids.data(), vals.data(), k, V, &mass);
      if (got < 0) {
        ++undecided;
        got = top.sample(logits.data(), V);
      } else {
        ++decided;
      }
      ASSERT_EQ(got, whole.sample(logits.data(), V)) << "top_p " << top_p << " min_p " << min_p << " step " << step;
    }
  }
  EXPECT_GT(decided, 60);
  EXPECT_GT(undecided, 10);
}

TEST(Gumbel, TheExponentialIsWithinOneUlpOfLibms) {
  std::mt19937_64 gen(8);
  std::uniform_real_distribution<double> u(-700.0, 0.0);
  const auto ulps = [](double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, 8), std::memcpy(&ib, &b, 8);
    return ia > ib ? ia - ib : ib - ia;
  };
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? u(gen) : u(gen) / 700.0 * (i % 7 + 1);  // the whole range, and near 0 more densely
    ASSERT_LE(ulps(smath::exp_exact(x), std::exp(x)), 1) << "x " << std::hexfloat << x;
  }
  EXPECT_EQ(smath::exp_exact(0.0), 1.0);
  EXPECT_EQ(smath::exp_exact(-701.0), 0.0);
}

TEST(Sampler, TheGumbelDrawOverALargeRowIsTheLargestScore) {
  // The host skips the exact noise of tokens whose bound cannot win: the draw must still be the largest score of all.
  std::mt19937 gen(77);
  const int V = 30000;
  const SamplerConfig c{.temperature = 0.9f, .top_k = 0, .top_p = 1.f, .seed = 12};
  Sampler s(c);
  for (int step = 0; step < 60; ++step) {
    std::normal_distribution<float> normal(0.f, step % 3 == 0 ? 0.2f : 3.f);  // flat and peaked rows
    std::vector<float> logits(V);
    for (float& x : logits) x = normal(gen);
    const uint64_t base = s.gumbel_base();
    int32_t want = 0;
    for (int i = 1; i < V; ++i)
      if (gumbel::score(logits[size_t(i)], double(c.temperature), base, uint64_t(i)) >
          gumbel::score(logits[size_t(want)], double(c.temperature), base, uint64_t(want)))
        want = i;
    ASSERT_EQ(s.sample(logits.data(), V), want) << "step " << step;
  }
}
