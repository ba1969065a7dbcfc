// ModelConfig: a Hugging Face config.json for the decoder-only families kvq runs (Qwen3, Qwen2 / 2.5, Llama 2 / 3.x,
// Mistral), validated once; everything downstream reads sizes from here. Both spellings of the fields are read: the
// Hub's (transformers 4: "torch_dtype", "rope_theta" + "rope_scaling") and transformers 5's ("dtype",
// "rope_parameters", "layer_types"). What these families can switch on that kvq does not implement (mixture of experts,
// quantized weights, other RoPE types, partial rotary, soft-capping, other attention kinds) is refused with one error
// naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvq {

enum class Arch { Qwen3, Qwen2, Llama, Mistral };

std::string_view arch_name(Arch arch);  // the model_type spelling: "qwen3", "qwen2", "llama", "mistral"

struct RopeConfig {
  double theta = 10000.0;             // base of the inverse frequencies
  std::string type = "default";       // "default" or "llama3"
  double factor = 1.0;                // llama3: wavelengths above low_freq_wavelen are divided by this
  double low_freq_factor = 1.0;       // llama3: low_freq_wavelen = original_max_position / low_freq_factor
  double high_freq_factor = 1.0;      // llama3: high_freq_wavelen = original_max_position / high_freq_factor
  int original_max_position = 0;      // llama3: the pre-extension context length (8192 for Llama 3.1)
};

struct ModelConfig {
  Arch arch = Arch::Qwen3;          // model family
  std::string model_type;           // config.json "model_type"
  int vocab_size = 0;               // rows of embed / lm_head
  int hidden_size = 0;              // residual width
  int intermediate_size = 0;        // MLP width
  int n_layers = 0;                 // decoder layers
  int n_heads = 0;                  // query heads
  int n_kv_heads = 0;               // key/value heads (GQA); divides n_heads
  int head_dim = 0;                 // per-head width d (even)
  int max_ctx = 0;                  // max_position_embeddings
  float rms_eps = 1e-6f;            // RMSNorm epsilon
  RopeConfig rope;                  // rotary embedding parameters
  bool tie_embeddings = false;      // lm_head shares embed's weights (no lm_head.weight tensor)
  bool qk_norm = false;             // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool qkv_bias = false;            // q/k/v projections carry a bias (Qwen2)
  // Sliding-window attention, per layer: a query at position t of layer l attends to the keys at positions
  // (t - layer_window[l], t] (transformers' sliding_window_overlay: kv > q - window), 0 = every earlier position.
  // [n_layers], or empty when no layer slides. Mistral: "sliding_window" on every layer; Qwen2 / Qwen3 with
  // "use_sliding_window": the layers from "max_window_layers" on; "layer_types" (transformers 5) names them.
  std::vector<int> layer_window;
  std::vector<int> eos_token_ids;   // end-of-sequence ids (may be empty)
  int bos_token_id = -1;            // -1 when the config has none
  std::string torch_dtype;          // "bfloat16", "float32", ... ("" when absent)
  float initializer_range = 0.02f;  // std of transformers' random init of linears and embeddings (--dummy-weights)
  std::string name_or_path;         // config.json "_name_or_path" (the hub id it was saved from; "" when absent)

  // Reads and parses path (config.json); throws kvq::Error naming the file and the field.
  static ModelConfig load(const std::string& path);
  // Parses a config.json object; where names it in error messages.
  static ModelConfig parse(const nlohmann::json& j, std::string_view where);

  int sliding_window() const;  // the widest layer window, 0 when no layer slides

  // Parameters of the checkpoint: embeddings, every layer's projections, norms and biases, and lm_head unless tied.
  int64_t n_params() const;

  // head_dim / 2 RoPE inverse frequencies (fp32), llama3 scaling applied as in transformers'
  // _compute_llama3_parameters.
  std::vector<float> rope_inv_freq() const;
};

}  // namespace kvq
