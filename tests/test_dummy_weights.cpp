// Dummy weights (model/dummy_weights.h, Weights::dummy, --dummy-weights) and the shape configs under models/shapes/:
// the public configs' shapes and parameter counts, the tensor table against a real checkpoint, the init
// distribution (std within sampling error, the Irwin-Hall kurtosis, norms 1, biases 0, every value a bf16),
// reproducibility for a seed on any thread count, and finite logits of a dummy model over a few hundred tokens.
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/half.h"
#include "model/runner.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

ModelConfig ref_config() { return ModelConfig::load(kSrc + "/models/ref/config.json"); }

// A small untied Qwen2 (biases, no QK-norm) of models/ref's family of sizes.
ModelConfig tiny_qwen2() {
  return ModelConfig::parse(nlohmann::json{{"model_type", "qwen2"}, {"vocab_size", 512}, {"hidden_size", 128},
                                           {"intermediate_size", 256}, {"num_hidden_layers", 2},
                                           {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                           {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-6},
                                           {"tie_word_embeddings", false}, {"initializer_range", 0.05}},
                            "tiny qwen2");
}

struct Moments {
  double n = 0, mean = 0, var = 0, kurtosis = 0;  // kurtosis: E[(x - mean)^4] / var^2
};

Moments moments(const Weights& w, const ModelConfig& cfg) {
  double s1 = 0, s2 = 0, s4 = 0, n = 0;
  for (const TensorSpec& t : model_tensors(cfg)) {
    if (t.init != TensorInit::Normal) continue;
    for (float x : w.values(t.role, t.layer)) s1 += x, s2 += double(x) * x, s4 += double(x) * x * x * x, n += 1;
  }
  Moments m;
  m.n = n, m.mean = s1 / n, m.var = s2 / n - m.mean * m.mean;
  m.kurtosis = (s4 / n) / (m.var * m.var);  // the mean is ~1e-5 sigma: not worth centring
  return m;
}

}  // namespace

TEST(ShapeConfigs, ParseWithThePublicShapesAndParameterCounts) {
  struct Want {
    const char* dir;
    int layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    bool tied;
    size_t params;  // the published sizes: 8.19B, 4.02B, 32.8B, 8.03B
  };
  for (const Want& w : {Want{"qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, false, 8190735360},
                        Want{"qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, true, 4022468096},
                        Want{"qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, false, 32762123264},
                        Want{"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, false, 8030261248}}) {
    SCOPED_TRACE(w.dir);
    const ModelConfig c = ModelConfig::load(kSrc + "/models/shapes/" + w.dir + "/config.json");
    EXPECT_EQ(c.n_layers, w.layers);
    EXPECT_EQ(c.hidden_size, w.hidden);
    EXPECT_EQ(c.n_heads, w.heads);
    EXPECT_EQ(c.n_kv_heads, w.kv_heads);
    EXPECT_EQ(c.head_dim, w.head_dim);
    EXPECT_EQ(c.intermediate_size, w.inter);
    EXPECT_EQ(c.vocab_size, w.vocab);
    EXPECT_EQ(c.tie_embeddings, w.tied);
    EXPECT_FLOAT_EQ(c.initializer_range, 0.02f);
    EXPECT_EQ(model_params(c), w.params);
  }
  const ModelConfig q = ModelConfig::load(kSrc + "/models/shapes/qwen3-8b/config.json");
  EXPECT_EQ(q.rope.theta, 1e6);
  EXPECT_EQ(q.rope.type, "default");
  EXPECT_TRUE(q.qk_norm);
  const ModelConfig l = ModelConfig::load(kSrc + "/models/shapes/llama-3.1-8b/config.json");
  EXPECT_EQ(l.arch, Arch::Llama);
  EXPECT_EQ(l.rope.type, "llama3");
  EXPECT_EQ(l.rope.factor, 8.0);
  EXPECT_EQ(l.rope.original_max_position, 8192);
  EXPECT_EQ(l.rope.theta, 500000.0);
  // The llama3 scaling divides the lowest frequencies by the factor and keeps the highest.
  const std::vector<float> inv = l.rope_inv_freq();
  EXPECT_FLOAT_EQ(inv.front(), 1.0f);
  EXPECT_FLOAT_EQ(inv.back(), 1.0f / std::pow(500000.0f, 126.0f / 128.0f) / 8.0f);
}

TEST(DummyWeights, HaveTheCheckpointsTensorsAndShapes) {
  const ModelConfig cfg = ref_config();
  const Weights real = Weights::load(Checkpoint::open(kSrc + "/models/ref"), cfg, 2);
  const Weights dummy = Weights::dummy(cfg, 7, 2);
  EXPECT_TRUE(dummy.is_dummy);
  EXPECT_FALSE(real.is_dummy);
  EXPECT_EQ(dummy.n_params, real.n_params);
  EXPECT_EQ(dummy.n_params, model_params(cfg));
  for (const TensorSpec& t : model_tensors(cfg)) {
    EXPECT_EQ(dummy.values(t.role, t.layer).size(), real.values(t.role, t.layer).size()) << t.name;
    EXPECT_EQ(dummy.values(t.role, t.layer).size(), t.numel()) << t.name;
    if (t.matrix()) {
      EXPECT_EQ(dummy.matrix(t.role, t.layer).dtype, DType::BF16) << t.name;  // generated in place
    }
  }
  EXPECT_TRUE(dummy.lm_head.empty());  // models/ref ties its embeddings
  ASSERT_EQ(dummy.layers.size(), size_t(cfg.n_layers));
  EXPECT_EQ(dummy.layers[0].q_norm.size(), size_t(cfg.head_dim));
  EXPECT_TRUE(dummy.layers[0].bq.empty());
}

TEST(DummyWeights, FollowTransformersInitWithTheIntendedStd) {
  const ModelConfig cfg = ref_config();
  const Weights w = Weights::dummy(cfg, 1, 2);
  const Moments m = moments(w, cfg);
  const double sigma = cfg.initializer_range;
  ASSERT_GT(m.n, 1e7);
  // Sampling error of the mean: sigma / sqrt(n); of the std: sigma / sqrt(2n) (kurtosis ~3). Five of each.
  EXPECT_NEAR(m.mean, 0.0, 5 * sigma / std::sqrt(m.n));
  EXPECT_NEAR(std::sqrt(m.var), sigma, 5 * sigma / std::sqrt(2 * m.n) + sigma * 1e-3);  // + bf16 rounding's share
  // A normal has kurtosis 3, the Irwin-Hall sum of 12 uniforms 2.9; a uniform would give 1.8 (SE here ~0.003).
  EXPECT_NEAR(m.kurtosis, 2.9, 0.03);
  for (const TensorSpec& t : model_tensors(cfg)) {
    const std::vector<float> v = w.values(t.role, t.layer);
    if (t.init == TensorInit::Ones) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << t.name;
    } else {
      for (float x : v) {
        ASSERT_EQ(bf16_to_f32(f32_to_bf16(x)), x) << t.name << ": not a bf16 value";
        ASSERT_LE(std::fabs(x), 6.0f * float(sigma) * 1.004f) << t.name << ": past the 6-sigma bound";
      }
    }
  }
  // A Qwen2: biases zero, its own initializer_range (0.05), an untied lm_head of the same std.
  const ModelConfig q2 = tiny_qwen2();
  const Weights w2 = Weights::dummy(q2, 1, 1);
  for (const auto& l : w2.layers)
    for (const std::vector<float>* b : {&l.bq, &l.bk, &l.bv}) {
      ASSERT_FALSE(b->empty());
      for (float x : *b) ASSERT_EQ(x, 0.0f);
    }
  double s2 = 0;
  const std::vector<float> head = w2.lm_head.to_f32();
  for (float x : head) s2 += double(x) * x;
  const double n = double(head.size());
  EXPECT_NEAR(std::sqrt(s2 / n), 0.05, 5 * 0.05 / std::sqrt(2 * n) + 0.05 * 1e-3);
}

TEST(DummyWeights, AreReproducibleForASeedOnAnyThreadCountAndDifferAcrossSeedsAndTensors) {
  const ModelConfig cfg = tiny_qwen2();
  const Weights a = Weights::dummy(cfg, 42, 1), b = Weights::dummy(cfg, 42, 2), c = Weights::dummy(cfg, 43, 2);
  size_t same_as_other_seed = 0, total = 0;
  for (const TensorSpec& t : model_tensors(cfg)) {
    EXPECT_EQ(a.values(t.role, t.layer), b.values(t.role, t.layer)) << t.name;
    if (t.init != TensorInit::Normal) continue;
    const std::vector<float> x = a.values(t.role, t.layer), y = c.values(t.role, t.layer);
    for (size_t i = 0; i < x.size(); ++i) same_as_other_seed += x[i] == y[i];
    total += x.size();
  }
  // Two independent deviates on a bf16 grid coincide rarely (about 1% of the time at this std).
  EXPECT_LT(double(same_as_other_seed) / double(total), 0.03);
  EXPECT_NE(a.layers[0].wq.to_f32(), a.layers[1].wq.to_f32());  // every (role, layer) has its own stream
  EXPECT_NE(a.layers[0].w_gate.to_f32(), a.layers[0].w_up.to_f32());
  // Value i is a pure function of (seed, stream, i): the same wherever a range starts.
  TensorSpec wq0{};
  for (const TensorSpec& t : model_tensors(cfg))
    if (t.role == TensorRole::Wq && t.layer == 0) wq0 = t;
  ASSERT_EQ(wq0.name, "model.layers.0.self_attn.q_proj.weight");
  for (size_t i : {size_t(0), size_t(1), size_t(12345), wq0.numel() - 1})
    EXPECT_EQ(dummy_value(TensorInit::Normal, 0.05f, 42, wq0.stream(), i), a.layers[0].wq.to_f32()[i]);
}

TEST(DummyWeights, ModelOfTheReferenceShapeGivesFiniteLogitsOverHundredsOfTokens) {
  const ModelConfig cfg = ref_config();
  auto m = Model::dummy(kSrc + "/models/ref", cfg, 3, 2);
  EXPECT_TRUE(m->dummy());
  CacheConfig cc;
  cc.max_chunk = 128;
  CpuRunner r(*m, cc, 300);
  EXPECT_NE(r.describe().find("dummy weights (timing only)"), std::string::npos) << r.describe();
  const int seq = r.new_sequence(), V = cfg.vocab_size;
  std::vector<int32_t> ids(256);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 2654435761u) % uint32_t(V));
  std::vector<float> logits(size_t(128) * V);
  double sum = 0, sum2 = 0, n = 0;
  for (int p = 0; p < int(ids.size()); p += 128) {
    r.forward(seq, ids.data() + p, 128, logits.data(), true);
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x)) << "at chunk " << p;
      sum += x, sum2 += double(x) * x, n += 1;
    }
  }
  // Not degenerate: logits spread (a tied head of std 0.02 over RMS-normed rows of width 384: std ~0.4).
  const double sd = std::sqrt(sum2 / n - (sum / n) * (sum / n));
  EXPECT_GT(sd, 0.05);
  EXPECT_LT(sd, 50.0);
  // And decode steps past them.
  std::vector<int32_t> next(1, 5);
  for (int i = 0; i < 8; ++i) {
    r.forward({seq}, {1}, next.data(), LogitRows::Last, logits.data(), next.data());
    for (int v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(logits[size_t(v)]));
  }
  EXPECT_EQ(r.length(seq), 256 + 8);
}
