// Model weights in fp32 host memory, loaded from a Checkpoint and shape-checked against a ModelConfig, or random
// ones of the config's shapes (--dummy-weights, model/dummy_weights.h). Linear weights keep Hugging Face's layout
// [out_features, in_features], row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/dummy_weights.h"
#include "model/safetensors.h"

namespace kvq {

// What a tensor is in the model; with its layer, it names one tensor (and one dummy RNG stream).
enum class TensorRole : uint8_t {
  Embed, FinalNorm, LmHead,                                        // the model's (layer -1)
  AttnNorm, Wq, Wk, Wv, Bq, Bk, Bv, QNorm, KNorm, Wo, MlpNorm,     // each layer's
  WGate, WUp, WDown,
  kCount
};

// One tensor a config calls for: THE table that the checkpoint loader, the dummy generator (host and GPU) and the
// GPU upload all read, so a model's tensors are listed once.
struct TensorSpec {
  TensorRole role;
  int layer;                   // decoder layer, -1 for the embedding, the final norm and lm_head
  std::string name;            // checkpoint name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for linear weights and the embedding, [n] for norms and biases
  TensorInit init;             // transformers' from_config initialisation (--dummy-weights)
  size_t numel() const;
  uint32_t stream() const;  // tensor_stream(role, layer)
};

// The dummy RNG stream of a tensor, distinct for every (role, layer) of a model: [0, (n_layers + 1) * kCount).
inline uint32_t tensor_stream(TensorRole role, int layer) {
  return uint32_t(layer + 1) * uint32_t(TensorRole::kCount) + uint32_t(role);
}
inline uint32_t TensorSpec::stream() const { return tensor_stream(role, layer); }

// Every tensor the config calls for, in checkpoint order (embed, final norm, lm_head unless tied, then per layer).
std::vector<TensorSpec> model_tensors(const ModelConfig& cfg);
// Scalars of all of them: the model's parameter count.
size_t model_params(const ModelConfig& cfg);

// hidden = hidden_size, d = head_dim, inter = intermediate_size; "empty" = a vector of size 0.
struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden] input_layernorm
  std::vector<float> wq;         // [n_heads * d, hidden]
  std::vector<float> wk;         // [n_kv_heads * d, hidden]
  std::vector<float> wv;         // [n_kv_heads * d, hidden]
  std::vector<float> bq;         // [n_heads * d] Qwen2 only, else empty
  std::vector<float> bk;         // [n_kv_heads * d] Qwen2 only, else empty
  std::vector<float> bv;         // [n_kv_heads * d] Qwen2 only, else empty
  std::vector<float> q_norm;     // [d] Qwen3 only (per-head RMSNorm weight), else empty
  std::vector<float> k_norm;     // [d] Qwen3 only, else empty
  std::vector<float> wo;         // [hidden, n_heads * d]
  std::vector<float> mlp_norm;   // [hidden] post_attention_layernorm
  std::vector<float> w_gate;     // [inter, hidden]
  std::vector<float> w_up;       // [inter, hidden]
  std::vector<float> w_down;     // [hidden, inter]
};

struct Weights {
  std::vector<float> embed;          // [vocab, hidden] model.embed_tokens.weight
  std::vector<float> final_norm;     // [hidden] model.norm.weight
  std::vector<float> lm_head;        // [vocab, hidden]; empty when tie_embeddings (use embed)
  std::vector<LayerWeights> layers;  // n_layers entries
  size_t n_params = 0;               // number of scalars loaded
  bool is_dummy = false;             // random (--dummy-weights): timing only

  // The output projection: lm_head, or embed when the embeddings are tied.
  const std::vector<float>& output() const { return lm_head.empty() ? embed : lm_head; }
  // The vector of a table entry (layers sized to the config).
  std::vector<float>& tensor(TensorRole role, int layer);
  const std::vector<float>& tensor(TensorRole role, int layer) const;

  // Loads every tensor the config calls for (F32 / F16 / BF16, converted on n_threads threads; 0 = all cores).
  // A missing tensor, a wrong shape or an unsupported dtype throws kvq::Error naming the tensor.
  static Weights load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads = 0);
  // Random weights of the config's shapes (model/dummy_weights.h: the values the GPU generates for the same seed),
  // filled on n_threads threads. Timing only.
  static Weights dummy(const ModelConfig& cfg, uint64_t seed, int n_threads = 0);
};

}  // namespace kvq
