// The value rotation folded into W_V / W_O (model/value_fold.h): the folded weights are the rotated products rounded
// once, a cache carrying the folded transform gives the logits of the per-step rotations up to that rounding, and a
// cache with any other transform still reads the model's own weights, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/half.h"
#include "model/runner.h"
#include "rotation/rotation_file.h"
#include "test_helpers.h"

using namespace kvq;

namespace {

std::unique_ptr<Model> load(const std::string& dir) { return Model::load(std::string(KVQ_SOURCE_DIR) + "/" + dir, 2); }

// A calibrated-like transform: random orthogonal R_K and R_V per (layer, kv head) and key means.
std::shared_ptr<const KvTransform> random_transform(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  auto t = std::make_shared<KvTransform>();
  t->n_layers = c.n_layers, t->n_kv_heads = c.n_kv_heads, t->head_dim = c.head_dim, t->name = "random";
  std::normal_distribution<float> nd(0.f, 0.1f);
  for (int m = 0; m < c.n_layers * c.n_kv_heads; ++m) {
    const auto rk = test::random_orthogonal(c.head_dim, rng), rv = test::random_orthogonal(c.head_dim, rng);
    t->r_k.insert(t->r_k.end(), rk.begin(), rk.end());
    t->r_v.insert(t->r_v.end(), rv.begin(), rv.end());
    for (int i = 0; i < c.head_dim; ++i) t->key_mean.push_back(nd(rng));
  }
  return t;
}

// The logits of every row of ids fed in chunks of 16 through a runner whose cache carries transform t.
std::vector<float> logits_of(Model& m, std::shared_ptr<const KvTransform> t, const std::string& type,
                             const std::vector<int32_t>& ids) {
  CacheConfig cc;
  cc.max_chunk = 16;
  cc.k.type = cc.v.type = type;
  cc.k.group = cc.v.group = std::min(128, m.config().head_dim);
  cc.sink = 4, cc.recent = 8;
  cc.transform = std::move(t);
  CpuRunner r(m, cc, 64);
  return test::feed_chunks(r, r.new_sequence(), ids, 0, int(ids.size()), 16, false);
}

float rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return float(std::sqrt(s / double(a.size())));
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST(ValueFold, FoldedWeightsAreTheRotatedProductsRoundedOnce) {
  auto m = load("models/ref");  // bf16 weights
  const ModelConfig& c = m->config();
  const auto t = random_transform(c, 1);
  const ValueFold* f = m->fold_value_rotation(t);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(m->value_fold(t.get()), f);
  EXPECT_TRUE(f->rest->r_v.empty());
  EXPECT_EQ(f->rest->r_k, t->r_k);
  EXPECT_EQ(f->rest->key_mean, t->key_mean);
  const int d = c.head_dim, H = c.hidden_size, g = c.n_heads / c.n_kv_heads, qd = c.n_heads * d;
  std::mt19937 rng(7);
  for (int l : {0, c.n_layers - 1}) {
    const LayerWeights& lw = m->weights().layers[size_t(l)];
    const ValueFold::Layer& fl = f->layers[size_t(l)];
    ASSERT_EQ(fl.wv.dtype, DType::BF16);
    const std::vector<float> wv = lw.wv.to_f32(), wo = lw.wo.to_f32(), fwv = fl.wv.to_f32(), fwo = fl.wo.to_f32();
    const float* R = t->r_v.data() + size_t(l) * c.n_kv_heads * d * d;
    // Each checked weight: the product in double, rounded once to bf16, within one bf16 step of the fold's.
    auto near_bf16 = [](double ref, float got) {
      const float r = bf16_to_f32(f32_to_bf16(float(ref)));
      return std::fabs(r - got) <= std::ldexp(std::fabs(r), -7) + 1e-30;
    };
    for (int s = 0; s < 200; ++s) {
      const int h = int(rng() % c.n_kv_heads), cc = int(rng() % d), k = int(rng() % H);
      double ref = 0;  // (R_hᵀ W_V[h])[cc][k]
      for (int i = 0; i < d; ++i) ref += double(R[(size_t(h) * d + i) * d + cc]) * wv[(size_t(h) * d + i) * H + k];
      ASSERT_TRUE(near_bf16(ref, fwv[(size_t(h) * d + cc) * H + k])) << "W_V' layer " << l << " row " << h * d + cc;
      const int row = int(rng() % H), j = int(rng() % c.n_heads), i = int(rng() % d);
      double ro = 0;  // (W_O[:, j] R_{j/g})[row][i]
      for (int cidx = 0; cidx < d; ++cidx)
        ro += double(wo[size_t(row) * qd + j * d + cidx]) * R[(size_t(j / g) * d + cidx) * d + i];
      ASSERT_TRUE(near_bf16(ro, fwo[size_t(row) * qd + j * d + i])) << "W_O' layer " << l << " row " << row;
    }
  }
}

TEST(ValueFold, FoldedStepsGiveTheRotatedStepsLogitsUpToTheWeightsRounding) {
  // A bf16 checkpoint (models/ref) and an fp32 one with value biases (Qwen2.5): the folded transform against an equal
  // copy of it (another object: rotated per step), at the bf16 cache and at int2.
  for (const char* dir : {"models/ref", "tests/models/qwen2.5-d64"}) {
    auto m = load(dir);
    const ModelConfig& c = m->config();
    const auto t = random_transform(c, 2);
    const auto copy = std::make_shared<KvTransform>(*t);
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(int32_t((i * 7919 + 13) % (c.vocab_size - 1) + 1));
    const std::vector<float> per_step = logits_of(*m, copy, "bf16", ids);
    ASSERT_NE(m->fold_value_rotation(t), nullptr);
    const std::vector<float> folded = logits_of(*m, t, "bf16", ids);
    const bool bf16_weights = m->weights().layers[0].wv.dtype == DType::BF16;
    const float bound = bf16_weights ? 0.05f : 1e-3f;
    EXPECT_LE(max_abs_diff(per_step, folded), bound) << dir;
    EXPECT_GT(max_abs_diff(per_step, folded), 0.f) << dir << ": the folded path did not run";
    int same_top1 = 0;
    const int V = c.vocab_size, rows = int(per_step.size()) / V;
    for (int r = 0; r < rows; ++r)
      same_top1 += argmax_row(per_step.data() + size_t(r) * V, V) == argmax_row(folded.data() + size_t(r) * V, V);
    EXPECT_GE(same_top1, rows - 1) << dir;
    // An f32 cache: only the weights' rounding is left (none beyond fp32's for an fp32 checkpoint).
    const float f32_diff = max_abs_diff(logits_of(*m, copy, "f32", ids), logits_of(*m, t, "f32", ids));
    EXPECT_LE(f32_diff, bf16_weights ? 0.05f : 1e-4f) << dir;
    // int2: the values are quantized from the folded products, so a code may flip at a rounding boundary and the two
    // runs draw different quantization noise; the folded one is as far from the bf16 cache as the per-step one.
    const std::vector<float> int2_step = logits_of(*m, copy, "int2", ids), int2_folded = logits_of(*m, t, "int2", ids);
    const float step_error = rms_diff(int2_step, per_step), folded_error = rms_diff(int2_folded, per_step);
    EXPECT_LE(folded_error, 1.1f * step_error) << dir;
    std::printf("  %s: max |logit difference| folded vs per-step: bf16 cache %.3g, f32 cache %.3g; int2 cache, RMS "
                "logit error against the bf16 cache: per-step %.4g, folded %.4g, between them %.4g\n",
                dir, max_abs_diff(per_step, folded), f32_diff, step_error, folded_error,
                rms_diff(int2_step, int2_folded));
  }
}

TEST(ValueFold, OtherCachesReadTheModelsOwnWeights) {
  auto m = load("models/ref");
  const ModelConfig& c = m->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(int32_t(i * 31 + 5));
  const auto other = random_transform(c, 4);
  const auto had = std::make_shared<KvTransform>(hadamard_transform(c.n_layers, c.n_kv_heads, c.head_dim));
  const std::vector<float> none0 = logits_of(*m, nullptr, "int2", ids), other0 = logits_of(*m, other, "int2", ids);
  ASSERT_NE(m->fold_value_rotation(had), nullptr);
  EXPECT_EQ(m->value_fold(other.get()), nullptr);
  EXPECT_EQ(logits_of(*m, nullptr, "int2", ids), none0);
  EXPECT_EQ(logits_of(*m, other, "int2", ids), other0);
  // A second fold replaces the first.
  ASSERT_NE(m->fold_value_rotation(other), nullptr);
  EXPECT_EQ(m->value_fold(had.get()), nullptr);
}

TEST(ValueFold, RefusesWhatItCannotFold) {
  auto m = load("models/ref");
  const ModelConfig& c = m->config();
  auto keys_only = std::make_shared<KvTransform>(hadamard_transform(c.n_layers, c.n_kv_heads, c.head_dim));
  keys_only->r_v.clear();
  EXPECT_EQ(m->fold_value_rotation(keys_only), nullptr);  // nothing to fold
  EXPECT_EQ(m->fold_value_rotation(nullptr), nullptr);
  const auto wrong = std::make_shared<KvTransform>(hadamard_transform(c.n_layers + 1, c.n_kv_heads, c.head_dim));
  EXPECT_NE(test::error_of([&] { m->fold_value_rotation(wrong); }).find("does not fit the model"), std::string::npos);
  // A layer tap reads the values before the transform: a folded step refuses it.
  const auto t = random_transform(c, 5);
  m->fold_value_rotation(t);
  struct Tap final : Model::LayerTap {
    void on_qkv(int, int, int, const float*, const float*, const float*) override {}
  } tap;
  m->set_tap(&tap);
  const std::vector<int32_t> ids = {1, 2, 3};
  EXPECT_NE(test::error_of([&] { logits_of(*m, t, "bf16", ids); }).find("layer tap"), std::string::npos);
  m->set_tap(nullptr);
}
