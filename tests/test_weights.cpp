// Checkpoint directories and Weights::load: tiny Qwen3 / Qwen2 / Llama checkpoints written by the test (one file,
// or two shards + index) load with the exact values written; the fingerprint ignores sharding but sees config and
// weight changes; conversion is identical on 1 and several threads. A real checkpoint under models/ref is loaded
// when present.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/half.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

using namespace kvq;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json tiny_config(const std::string& model_type, bool tied) {
  json j = {{"model_type", model_type}, {"vocab_size", 32},       {"hidden_size", 16},
            {"intermediate_size", 24},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},    {"tie_word_embeddings", tied},   {"eos_token_id", 2},
            {"bos_token_id", 1},        {"torch_dtype", "bfloat16"}};
  if (model_type == "qwen3") j["head_dim"] = 8;  // != hidden / heads, as in real Qwen3
  if (model_type == "llama") {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  }
  return j;
}

// The HF tensor names and shapes of a model, written independently of weights.cpp.
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {{"model.embed_tokens.weight", {c.vocab_size, h}},
                                                                 {"model.norm.weight", {h}}};
  if (!c.tie_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "self_attn.q_proj.weight", {q, h}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.arch == Arch::Qwen2) {
      t.push_back({p + "self_attn.q_proj.bias", {q}});
      t.push_back({p + "self_attn.k_proj.bias", {kv}});
      t.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.arch == Arch::Qwen3) {
      t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    t.push_back({p + "self_attn.o_proj.weight", {h, q}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    t.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
    t.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
    t.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
  }
  return t;
}

float round_to(DType dt, float v) {
  return dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : dt == DType::F16 ? fp16_to_f32(f32_to_fp16(v)) : v;
}

struct TinyCheckpoint {
  std::string dir;
  ModelConfig cfg;
  std::map<std::string, std::vector<float>> values;  // name -> exact fp32 values after storage rounding
};

// Writes config.json and the tensors (dtypes cycle through `dtypes`), in one file or in two shards + index.
TinyCheckpoint write_tiny(const std::string& name, const json& config, bool sharded,
                          std::vector<DType> dtypes = {DType::BF16}, size_t seed = 0) {
  TinyCheckpoint ck;
  ck.dir = (fs::temp_directory_path() / ("kvq_weights_" + name + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(ck.dir);
  fs::create_directories(ck.dir);
  std::ofstream(ck.dir + "/config.json") << config.dump(2);
  ck.cfg = ModelConfig::parse(config, name);
  std::vector<OwnedTensor> tensors;
  size_t k = seed;
  for (const auto& [tname, shape] : hf_tensors(ck.cfg)) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    const DType dt = dtypes[k % dtypes.size()];
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = round_to(dt, std::sin(0.37f * float(i) + 1.7f * float(k)) * 0.5f);
    ck.values[tname] = v;
    tensors.push_back(OwnedTensor::from_f32(tname, dt, shape, v));
    ++k;
  }
  if (!sharded) {
    write_safetensors(ck.dir + "/model.safetensors", tensors, {{"format", "pt"}});
    return ck;
  }
  const size_t split = tensors.size() / 2;
  const std::string shard_name[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  json weight_map = json::object();
  std::vector<OwnedTensor> parts[2];
  for (size_t i = 0; i < tensors.size(); ++i) {
    weight_map[tensors[i].name] = shard_name[i >= split];
    parts[i >= split].push_back(tensors[i]);
  }
  for (int s = 0; s < 2; ++s) write_safetensors(ck.dir + "/" + shard_name[s], parts[s], {{"format", "pt"}});
  std::ofstream(ck.dir + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  return ck;
}

// Every tensor of w equals the value written under its HF name.
void expect_weights_match(const Weights& w, const TinyCheckpoint& ck) {
  const auto& v = ck.values;
  EXPECT_EQ(w.embed.to_f32(), v.at("model.embed_tokens.weight"));
  EXPECT_EQ(w.final_norm, v.at("model.norm.weight"));
  if (ck.cfg.tie_embeddings) {
    EXPECT_TRUE(w.lm_head.empty());
    EXPECT_EQ(&w.output(), &w.embed);
  } else {
    EXPECT_EQ(w.lm_head.to_f32(), v.at("lm_head.weight"));
    EXPECT_EQ(&w.output(), &w.lm_head);
  }
  ASSERT_EQ(w.layers.size(), size_t(ck.cfg.n_layers));
  size_t n_params = 0;
  for (const auto& [name, vals] : v) n_params += vals.size();
  EXPECT_EQ(w.n_params, n_params);
  for (int i = 0; i < ck.cfg.n_layers; ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const LayerWeights& l = w.layers[size_t(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    EXPECT_EQ(l.attn_norm, v.at(p + "input_layernorm.weight"));
    EXPECT_EQ(l.wq.to_f32(), v.at(p + "self_attn.q_proj.weight"));
    EXPECT_EQ(l.wk.to_f32(), v.at(p + "self_attn.k_proj.weight"));
    EXPECT_EQ(l.wv.to_f32(), v.at(p + "self_attn.v_proj.weight"));
    EXPECT_EQ(l.wo.to_f32(), v.at(p + "self_attn.o_proj.weight"));
    EXPECT_EQ(l.mlp_norm, v.at(p + "post_attention_layernorm.weight"));
    EXPECT_EQ(l.w_gate.to_f32(), v.at(p + "mlp.gate_proj.weight"));
    EXPECT_EQ(l.w_up.to_f32(), v.at(p + "mlp.up_proj.weight"));
    EXPECT_EQ(l.w_down.to_f32(), v.at(p + "mlp.down_proj.weight"));
    if (ck.cfg.qkv_bias) {
      EXPECT_EQ(l.bq, v.at(p + "self_attn.q_proj.bias"));
      EXPECT_EQ(l.bk, v.at(p + "self_attn.k_proj.bias"));
      EXPECT_EQ(l.bv, v.at(p + "self_attn.v_proj.bias"));
    } else {
      EXPECT_TRUE(l.bq.empty() && l.bk.empty() && l.bv.empty());
    }
    if (ck.cfg.qk_norm) {
      EXPECT_EQ(l.q_norm, v.at(p + "self_attn.q_norm.weight"));
      EXPECT_EQ(l.k_norm, v.at(p + "self_attn.k_norm.weight"));
    } else {
      EXPECT_TRUE(l.q_norm.empty() && l.k_norm.empty());
    }
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kvq::Error";
  return {};
}

}  // namespace

TEST(Weights, TinyQwen3SingleFileTiedLoadsExactValuesWithQkNorm) {
  const TinyCheckpoint ck = write_tiny("qwen3", tiny_config("qwen3", true), false);
  const Checkpoint c = Checkpoint::open(ck.dir);
  EXPECT_EQ(c.shards().size(), 1u);
  EXPECT_EQ(c.names().size(), ck.values.size());
  expect_weights_match(Weights::load(c, ModelConfig::load(c.config_path())), ck);
  const Weights w = Weights::load(c, ck.cfg);
  EXPECT_EQ(w.layers[0].wq.rows, 4 * 8);  // [n_heads * head_dim, hidden]
  EXPECT_EQ(w.layers[0].wq.cols, 16);
  // In place: the matrices point into the checkpoint's mapping, in its dtype; nothing is owned.
  const TensorRef ref = c.get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(w.layers[0].wq.data, ref.data);
  EXPECT_EQ(w.layers[0].wq.dtype, DType::BF16);
  EXPECT_EQ(w.owned_bytes(), 0u);
  EXPECT_EQ(w.matrix_bytes(), model_matrix_bytes(ck.cfg, 2) - 4 * (16 + 2 * (16 + 16 + 8 + 8)));
  fs::remove_all(ck.dir);
}

TEST(Weights, TinyQwen2TwoShardsUntiedLoadsBiases) {
  const TinyCheckpoint ck = write_tiny("qwen2", tiny_config("qwen2", false), true);
  const Checkpoint c = Checkpoint::open(ck.dir);
  EXPECT_EQ(c.shards().size(), 2u);
  EXPECT_TRUE(c.has("model.layers.1.self_attn.v_proj.bias"));
  EXPECT_FALSE(c.has("model.layers.1.self_attn.q_norm.weight"));
  expect_weights_match(Weights::load(c, ck.cfg), ck);
  fs::remove_all(ck.dir);
}

TEST(Weights, TinyLlamaMixedF32F16BF16ShardsLoad) {
  for (bool sharded : {false, true}) {
    const TinyCheckpoint ck = write_tiny("llama", tiny_config("llama", false), sharded,
                                         {DType::F32, DType::F16, DType::BF16});
    const Checkpoint c = Checkpoint::open(ck.dir);
    EXPECT_EQ(c.get("model.norm.weight").info->dtype, DType::F16);
    expect_weights_match(Weights::load(c, ck.cfg, 3), ck);
    fs::remove_all(ck.dir);
  }
}

TEST(Weights, ConversionIsIdenticalOnOneAndManyThreadsForMultiChunkTensors) {
  json cfg = tiny_config("qwen3", true);
  cfg["vocab_size"] = 70000;  // embed = 70000 x 16 = 1.12M elements: two conversion chunks
  const TinyCheckpoint ck = write_tiny("threads", cfg, false);
  const Checkpoint c = Checkpoint::open(ck.dir);
  const Weights one = Weights::load(c, ck.cfg, 1);
  const Weights many = Weights::load(c, ck.cfg, 4);
  EXPECT_EQ(one.embed.to_f32(), ck.values.at("model.embed_tokens.weight"));
  EXPECT_EQ(many.embed.to_f32(), one.embed.to_f32());
  EXPECT_EQ(many.layers[1].w_down.to_f32(), one.layers[1].w_down.to_f32());
  EXPECT_EQ(many.layers[1].attn_norm, one.layers[1].attn_norm);
  fs::remove_all(ck.dir);
}

TEST(Weights, ExtraTensorsAreIgnoredAndLmHeadIsUnusedWhenTied) {
  // A tied config whose checkpoint still carries lm_head.weight (some exporters write it): embed is the output.
  json untied = tiny_config("qwen3", false);
  const TinyCheckpoint ck = write_tiny("extra", untied, false);
  json tied = untied;
  tied["tie_word_embeddings"] = true;
  const Weights w = Weights::load(Checkpoint::open(ck.dir), ModelConfig::parse(tied, "tied"));
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_EQ(w.output().to_f32(), ck.values.at("model.embed_tokens.weight"));
  fs::remove_all(ck.dir);
}

TEST(Weights, ConfigTensorMismatchNamesTensorExpectedAndActualShape) {
  const TinyCheckpoint ck = write_tiny("mismatch", tiny_config("qwen3", true), false);
  json wider = tiny_config("qwen3", true);
  wider["intermediate_size"] = 32;
  const Checkpoint c = Checkpoint::open(ck.dir);
  const std::string msg = error_of([&] { Weights::load(c, ModelConfig::parse(wider, "w")); });
  EXPECT_NE(msg.find("tensor 'model.layers.0.mlp.gate_proj.weight' in " + ck.dir +
                     " has shape [24, 16], expected [32, 16]"),
            std::string::npos)
      << msg;
  // A Qwen2 config over Qwen3 weights: the Qwen2 biases are missing.
  json qwen2 = tiny_config("qwen2", true);
  qwen2["head_dim"] = 8;
  EXPECT_NE(error_of([&] { Weights::load(c, ModelConfig::parse(qwen2, "q2")); })
                .find("missing tensor 'model.layers.0.self_attn.q_proj.bias' in checkpoint " + ck.dir),
            std::string::npos);
  fs::remove_all(ck.dir);
}

TEST(Checkpoint, FingerprintIgnoresShardingButSeesConfigAndWeightChanges) {
  const json cfg = tiny_config("qwen2", false);
  const TinyCheckpoint single = write_tiny("fp_single", cfg, false);
  const TinyCheckpoint sharded = write_tiny("fp_sharded", cfg, true);
  const std::string fp = Checkpoint::open(single.dir).fingerprint();
  EXPECT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(Checkpoint::open(sharded.dir).fingerprint(), fp);  // same tensors and config, different sharding
  EXPECT_EQ(Checkpoint::open(single.dir).fingerprint(), fp);   // deterministic

  const TinyCheckpoint other_weights = write_tiny("fp_weights", cfg, false, {DType::BF16}, 1);
  EXPECT_NE(Checkpoint::open(other_weights.dir).fingerprint(), fp);  // same headers, different weights

  std::ofstream(single.dir + "/config.json") << tiny_config("qwen2", false).dump(4);  // same fields, new bytes
  EXPECT_NE(Checkpoint::open(single.dir).fingerprint(), fp);
  for (const auto& d : {single.dir, sharded.dir, other_weights.dir}) fs::remove_all(d);
}

TEST(Checkpoint, GetOfAMissingTensorAndMissingDirectoryAreClearErrors) {
  const TinyCheckpoint ck = write_tiny("get", tiny_config("llama", true), false);
  const Checkpoint c = Checkpoint::open(ck.dir);
  EXPECT_EQ(c.dir(), ck.dir);
  const std::vector<std::string> names = c.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(c.get("model.layers.1.mlp.up_proj.weight").info->shape, (std::vector<int64_t>{24, 16}));
  EXPECT_NE(error_of([&] { c.get("model.layers.9.mlp.up_proj.weight"); })
                .find("missing tensor 'model.layers.9.mlp.up_proj.weight' in checkpoint " + ck.dir),
            std::string::npos);
  EXPECT_NE(error_of([] { Checkpoint::open("/nonexistent/kvq_ckpt"); }).find("does not exist or is not a directory"),
            std::string::npos);
  fs::remove_all(ck.dir);
}

// The trained reference checkpoint of the project (3 shards + index), when it has been produced.
TEST(Weights, ReferenceCheckpointLoadsWithConsistentShapes) {
  const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/ref";
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << dir << " is absent (produced by scripts/train_reference.py)";
  const Checkpoint c = Checkpoint::open(dir);
  const ModelConfig cfg = ModelConfig::load(c.config_path());
  EXPECT_EQ(cfg.arch, Arch::Qwen3);
  const Weights w = Weights::load(c, cfg);
  size_t want_params = 0;
  for (const auto& [name, shape] : hf_tensors(cfg)) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    want_params += n;
  }
  EXPECT_EQ(w.n_params, want_params);
  EXPECT_EQ(w.embed.numel(), size_t(cfg.vocab_size) * size_t(cfg.hidden_size));
  for (const LayerWeights& l : w.layers) {
    EXPECT_EQ(l.q_norm.size(), size_t(cfg.head_dim));
    for (float x : l.attn_norm) ASSERT_TRUE(std::isfinite(x));
  }
  double sum_sq = 0;
  for (float x : w.embed.to_f32()) sum_sq += double(x) * x;
  EXPECT_TRUE(std::isfinite(sum_sq));
  EXPECT_GT(sum_sq, 0.0);  // trained weights are not all zero
  EXPECT_EQ(Checkpoint::open(dir).fingerprint(), c.fingerprint());
}
