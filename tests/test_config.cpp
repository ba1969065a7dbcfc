// ModelConfig: real Qwen3 / Qwen2.5 / Llama 3.2 config.json contents parse to the right fields, defaults follow
// transformers, bad configs are refused with a message naming the field, and the llama3 RoPE scaling matches a
// hand-computed case.
#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/config.h"

using namespace kvq;
using json = nlohmann::json;

namespace {

const char* kQwen3_0_6B = R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
  "bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":1024,
  "initializer_range":0.02,"intermediate_size":3072,"max_position_embeddings":40960,"max_window_layers":28,
  "model_type":"qwen3","num_attention_heads":16,"num_hidden_layers":28,"num_key_value_heads":8,"rms_norm_eps":1e-06,
  "rope_scaling":null,"rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
  "transformers_version":"4.51.0","use_cache":true,"use_sliding_window":false,"vocab_size":151936})";

const char* kQwen25_0_5B = R"({"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,
  "eos_token_id":151643,"hidden_act":"silu","hidden_size":896,"initializer_range":0.02,"intermediate_size":4864,
  "max_position_embeddings":32768,"max_window_layers":24,"model_type":"qwen2","num_attention_heads":14,
  "num_hidden_layers":24,"num_key_value_heads":2,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":32768,
  "tie_word_embeddings":true,"torch_dtype":"bfloat16","use_cache":true,"use_sliding_window":false,
  "vocab_size":151936})";

const char* kLlama32_1B = R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
  "bos_token_id":128000,"eos_token_id":[128001,128008,128009],"head_dim":64,"hidden_act":"silu","hidden_size":2048,
  "initializer_range":0.02,"intermediate_size":8192,"max_position_embeddings":131072,"mlp_bias":false,
  "model_type":"llama","num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"pretraining_tp":1,
  "rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
  "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":true,
  "torch_dtype":"bfloat16","vocab_size":128256})";

std::string error_of(const json& j) {
  try {
    ModelConfig::parse(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kvq::Error for " << j.dump();
  return {};
}

}  // namespace

TEST(ModelConfig, Qwen3ConfigHasQkNormNoBiasAndExplicitHeadDim) {
  const ModelConfig c = ModelConfig::parse(json::parse(kQwen3_0_6B), "qwen3");
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.n_layers, 28);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(c.max_ctx, 40960);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151645});
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, Qwen2ConfigHasQkvBiasAndDefaultHeadDim) {
  const ModelConfig c = ModelConfig::parse(json::parse(kQwen25_0_5B), "qwen2");
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151643});
}

TEST(ModelConfig, Llama3ConfigReadsRopeScalingAndEosList) {
  const ModelConfig c = ModelConfig::parse(json::parse(kLlama32_1B), "llama");
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
}

TEST(ModelConfig, AcceptsTransformers5RopeParametersAndDtypeKey) {
  json j = json::parse(kLlama32_1B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  const ModelConfig c = ModelConfig::parse(j, "v5");
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.torch_dtype, "float32");

  json q = json::parse(kQwen3_0_6B);
  q.erase("rope_theta");
  q["rope_parameters"] = {{"rope_theta", 5e6}, {"rope_type", "default"}};
  EXPECT_EQ(ModelConfig::parse(q, "v5").rope.theta, 5e6);
  EXPECT_EQ(ModelConfig::parse(q, "v5").rope.type, "default");
}

TEST(ModelConfig, DefaultsFollowTransformers) {
  json j = json::parse(kQwen3_0_6B);
  for (const char* key : {"num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings", "eos_token_id",
                          "bos_token_id", "torch_dtype"}) {
    j.erase(key);
  }
  const ModelConfig c = ModelConfig::parse(j, "defaults");
  EXPECT_EQ(c.n_kv_heads, 16);  // = heads
  EXPECT_EQ(c.head_dim, 64);    // hidden / heads
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.torch_dtype, "");
}

TEST(ModelConfig, RefusesInvalidOrUnsupportedConfigsNamingTheField) {
  const json base = json::parse(kQwen3_0_6B);
  auto with = [&](const char* key, json v) {
    json j = base;
    j[key] = std::move(v);
    return j;
  };
  EXPECT_NE(error_of(with("model_type", "gemma")).find("cfg.json: unsupported model_type 'gemma' (supported: qwen3"),
            std::string::npos);
  EXPECT_NE(error_of(with("num_key_value_heads", 3)).find("num_attention_heads 16 is not divisible by "
                                                          "num_key_value_heads 3"),
            std::string::npos);
  EXPECT_NE(error_of(with("num_key_value_heads", 0)).find("not divisible"), std::string::npos);
  EXPECT_NE(error_of(with("hidden_size", 0)).find("\"hidden_size\" = 0 must be positive"), std::string::npos);
  EXPECT_NE(error_of(with("num_hidden_layers", 1.5)).find("\"num_hidden_layers\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(with("vocab_size", 1LL << 40)).find("out of range"), std::string::npos);
  EXPECT_NE(error_of(with("rms_norm_eps", 0)).find("rms_norm_eps 0 must be in (0, 1)"), std::string::npos);
  EXPECT_NE(error_of(with("hidden_act", "gelu")).find("unsupported hidden_act 'gelu'"), std::string::npos);
  EXPECT_NE(error_of(with("attention_bias", true)).find("attention_bias=true is not supported"), std::string::npos);
  EXPECT_NE(error_of(with("tie_word_embeddings", "yes")).find("\"tie_word_embeddings\" must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(with("bos_token_id", -3)).find("bos_token_id -3 must be in [0, vocab_size 151936)"),
            std::string::npos);
  EXPECT_NE(error_of(with("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}})).find("unsupported rope type "
                                                                                             "'dynamic'"),
            std::string::npos);
  json bad_llama3 = json::parse(kLlama32_1B);
  bad_llama3["rope_scaling"]["high_freq_factor"] = 1.0;  // == low: the blend would divide by zero
  EXPECT_NE(error_of(bad_llama3).find("invalid llama3 rope scaling"), std::string::npos);
  json both = base;
  both["rope_parameters"] = {{"rope_theta", 5.0}, {"rope_type", "default"}};
  EXPECT_NE(error_of(both).find("disagrees with rope_parameters.rope_theta"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("config must be a JSON object"), std::string::npos);
}

namespace {

// Mistral-7B-v0.1's config (sliding_window 4096 on every layer); v0.3 writes "sliding_window": null (none).
const char* kMistral7B = R"({"architectures":["MistralForCausalLM"],"bos_token_id":1,"eos_token_id":2,
  "hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,
  "max_position_embeddings":32768,"model_type":"mistral","num_attention_heads":32,"num_hidden_layers":32,
  "num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,"sliding_window":4096,
  "tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.34.0.dev0","use_cache":true,
  "vocab_size":32000})";

}  // namespace

TEST(ModelConfig, MistralSlidesEveryLayerAndNullMeansNoWindow) {
  const ModelConfig c = ModelConfig::parse(json::parse(kMistral7B), "mistral");
  EXPECT_EQ(c.arch, Arch::Mistral);
  EXPECT_EQ(arch_name(c.arch), "mistral");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window(), 4096);
  EXPECT_EQ(c.layer_window, std::vector<int>(32, 4096));
  json v03 = json::parse(kMistral7B);
  v03["sliding_window"] = nullptr;
  EXPECT_TRUE(ModelConfig::parse(v03, "v0.3").layer_window.empty());
  json absent = json::parse(kMistral7B);
  absent.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(ModelConfig::parse(absent, "default").sliding_window(), 4096);
}

TEST(ModelConfig, QwenSlidingWindowFollowsUseSlidingWindowMaxWindowLayersAndLayerTypes) {
  json q = json::parse(kQwen3_0_6B);  // 28 layers
  q["sliding_window"] = 512;
  EXPECT_TRUE(ModelConfig::parse(q, "off").layer_window.empty());  // use_sliding_window false
  q["use_sliding_window"] = true;
  q["max_window_layers"] = 20;  // layers 20..27 slide, as transformers derives layer_types
  std::vector<int> want(28, 0);
  for (int l = 20; l < 28; ++l) want[size_t(l)] = 512;
  EXPECT_EQ(ModelConfig::parse(q, "on").layer_window, want);
  // transformers 5 writes layer_types: they decide which layers slide.
  json types = json::array();
  for (int l = 0; l < 28; ++l) types.push_back(l % 2 ? "sliding_attention" : "full_attention");
  q["layer_types"] = types;
  const ModelConfig t = ModelConfig::parse(q, "types");
  for (int l = 0; l < 28; ++l) EXPECT_EQ(t.layer_window[size_t(l)], l % 2 ? 512 : 0) << l;
  q["layer_types"][3] = "chunked_attention";
  EXPECT_NE(error_of(q).find("unsupported \"layer_types\"[3] = \"chunked_attention\""), std::string::npos);
  q["layer_types"] = json::array({"full_attention"});
  EXPECT_NE(error_of(q).find("\"layer_types\" must be an array of num_hidden_layers = 28 strings"),
            std::string::npos);
}

// A config as transformers 5.x's save_pretrained writes it: "dtype", "rope_parameters", "layer_types".
TEST(ModelConfig, ReadsAConfigAsTransformers5WritesIt) {
  const json j = json::parse(R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
    "bos_token_id":151643,"dtype":"bfloat16","eos_token_id":151645,"head_dim":128,"hidden_act":"silu",
    "hidden_size":1024,"initializer_range":0.02,"intermediate_size":3072,
    "layer_types":["full_attention","full_attention"],"max_position_embeddings":40960,"max_window_layers":28,
    "model_type":"qwen3","num_attention_heads":16,"num_hidden_layers":2,"num_key_value_heads":8,"rms_norm_eps":1e-06,
    "rope_parameters":{"rope_theta":1000000,"rope_type":"default"},"sliding_window":null,"tie_word_embeddings":true,
    "transformers_version":"5.0.0","use_cache":true,"use_sliding_window":false,"vocab_size":151936})");
  const ModelConfig c = ModelConfig::parse(j, "v5");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_TRUE(c.layer_window.empty());
  EXPECT_EQ(c.n_layers, 2);
}

TEST(ModelConfig, RefusesMoeQuantizedPartialRotaryAndSoftCappingNamingTheField) {
  const json base = json::parse(kQwen3_0_6B);
  auto with = [&](const char* key, json v) {
    json j = base;
    j[key] = std::move(v);
    return j;
  };
  EXPECT_NE(error_of(with("num_experts", 128)).find("\"num_experts\" = 128: mixture-of-experts layers are not "
                                                    "supported"),
            std::string::npos);
  EXPECT_NE(error_of(with("num_local_experts", 8)).find("\"num_local_experts\" = 8"), std::string::npos);
  EXPECT_NE(error_of(with("moe_intermediate_size", 768)).find("\"moe_intermediate_size\" = 768"), std::string::npos);
  EXPECT_NO_THROW(ModelConfig::parse(with("num_experts", 0), "dense"));  // some dense configs write 0
  EXPECT_NE(error_of(with("quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}))
                .find("\"quantization_config\" (quant_method \"gptq\"): quantized checkpoints are not supported"),
            std::string::npos);
  EXPECT_NE(error_of(with("partial_rotary_factor", 0.5)).find("unsupported partial_rotary_factor 0.5"),
            std::string::npos);
  json partial = base;
  partial["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
  partial.erase("rope_theta");
  EXPECT_NE(error_of(partial).find("\"rope_parameters\".partial_rotary_factor 0.25"), std::string::npos);
  EXPECT_NE(error_of(with("final_logit_softcapping", 30.0)).find("\"final_logit_softcapping\" = 30.0: logit "
                                                                 "soft-capping is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(with("model_type", "qwen3_moe")).find("unsupported model_type 'qwen3_moe'"), std::string::npos);
  EXPECT_NE(error_of(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}))
                .find("unsupported rope type 'yarn' in \"rope_scaling\" (supported: default, llama3)"),
            std::string::npos);
}

TEST(ModelConfig, LoadNamesTheFileOnBadJsonOrMissingFile) {
  try {
    ModelConfig::load("/nonexistent/config.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open '/nonexistent/config.json'"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, DefaultRopeInverseFrequenciesArePowersOfTheta) {
  json j = json::parse(kQwen3_0_6B);
  j["head_dim"] = 8;
  j["rope_theta"] = 10000.0;
  const std::vector<float> f = ModelConfig::parse(j, "t").rope_inv_freq();
  ASSERT_EQ(f.size(), 4u);
  const double want[] = {1.0, 0.1, 0.01, 0.001};  // 10000^(-2i/8)
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], want[i] * 1e-6) << i;
}

TEST(ModelConfig, Llama3RopeScalingMatchesHandComputedCase) {
  // d = 8, theta = 1e4: base inv_freq = {1, 0.1, 0.01, 0.001}, wavelengths 2*pi/f = {6.28, 62.8, 628.3, 6283}.
  // original 1000, low 1, high 4, factor 8: low_freq_wavelen = 1000, high_freq_wavelen = 250.
  //   i = 0, 1: wavelen < 250            -> unchanged
  //   i = 3:    wavelen 6283 > 1000      -> 0.001 / 8 = 1.25e-4
  //   i = 2:    250 <= 628.3 <= 1000     -> smooth = (1000 / 628.3185 - 1) / (4 - 1) = (5/pi - 1) / 3 = 0.1971831
  //             (1 - smooth) * 0.01 / 8 + smooth * 0.01 = 0.01 * (0.1003521 + 0.1971831) = 0.002975352
  json j = json::parse(kLlama32_1B);
  j["head_dim"] = 8;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 1000}};
  const std::vector<float> f = ModelConfig::parse(j, "t").rope_inv_freq();
  ASSERT_EQ(f.size(), 4u);
  const double smooth = (5.0 / M_PI - 1.0) / 3.0;
  const double want[] = {1.0, 0.1, 0.01 * ((1 - smooth) / 8 + smooth), 1.25e-4};
  EXPECT_NEAR(want[2], 0.002975352, 1e-9);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], want[i] * 1e-6) << i;
}

TEST(ModelConfig, Llama32RopeFrequenciesMatchADoublePrecisionReference) {
  const ModelConfig c = ModelConfig::parse(json::parse(kLlama32_1B), "llama");
  const std::vector<float> f = c.rope_inv_freq();
  ASSERT_EQ(f.size(), 32u);
  int n_scaled = 0, n_kept = 0, n_blended = 0;
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 64);
    const double wavelen = 2 * M_PI / base;
    double want = base;
    if (wavelen > 8192.0 / 1.0) {
      want = base / 32, ++n_scaled;
    } else if (wavelen < 8192.0 / 4.0) {
      ++n_kept;
    } else {
      const double s = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - s) * base / 32 + s * base, ++n_blended;
    }
    EXPECT_NEAR(f[size_t(i)], want, want * 2e-6) << i;
  }
  EXPECT_GT(n_scaled, 0);
  EXPECT_GT(n_kept, 0);
  EXPECT_GT(n_blended, 0);
}
