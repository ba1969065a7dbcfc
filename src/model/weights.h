// Model weights in fp32 host memory, loaded from a Checkpoint and shape-checked against a ModelConfig.
// Linear weights keep Hugging Face's layout [out_features, in_features], row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace kvq {

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

  // The output projection: lm_head, or embed when the embeddings are tied.
  const std::vector<float>& output() const { return lm_head.empty() ? embed : lm_head; }

  // Loads every tensor the config calls for (F32 / F16 / BF16, converted on n_threads threads; 0 = all cores).
  // A missing tensor, a wrong shape or an unsupported dtype throws kvq::Error naming the tensor.
  static Weights load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads = 0);
};

}  // namespace kvq
