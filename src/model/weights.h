// Model weights where they lie: the linear layers and the embedding are read in place from the checkpoint's memory
// mapping in its own dtype (BF16, F16 or F32: no fp32 copy of the model), or generated in host memory as bf16 of the
// config's shapes (--dummy-weights, model/dummy_weights.h); the norm weights and biases (kilobytes) are widened to
// fp32 once. Linear weights keep Hugging Face's layout [out_features, in_features], row-major. Everything is
// shape-checked against a ModelConfig before any value is read.
//
// Host memory. A mapped tensor costs page cache (shared, file-backed, evictable), not the process's own memory: an
// 8B bf16 checkpoint is 16 GB of page cache on the CPU, and the GPU upload drops each tensor's pages from the process
// once it is on the device (WeightTensor::release). Only a tensor whose bytes are not aligned to its element size in
// the file (never in files written by safetensors' writers) is copied once, into memory the Weights own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
  bool matrix() const { return shape.size() == 2; }  // a linear weight or the embedding (else a norm or a bias)
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
// Bytes of the matrices (linear weights and the embedding) as the checkpoint stores them, or as bf16 (dummy weights);
// the vectors are counted at 4 bytes (fp32 on the host).
size_t model_matrix_bytes(const ModelConfig& cfg, size_t bytes_per_value);

// A matrix [rows, cols] in its dtype, where it lies: inside a checkpoint's mapping, or in memory a Weights owns. A
// view: the Weights it came from must outlive it.
struct WeightTensor {
  DType dtype = DType::BF16;     // F32, F16 or BF16
  const uint8_t* data = nullptr; // rows * cols elements, row-major, aligned to the element size
  int64_t rows = 0, cols = 0;    // [out, in] of a linear weight; [vocab, hidden] of the embedding
  const MappedFile* file = nullptr;  // the mapping it lies in (release), or null for owned memory

  bool empty() const { return data == nullptr; }
  size_t numel() const { return size_t(rows) * size_t(cols); }
  size_t nbytes() const { return numel() * dtype_size(dtype); }
  // Elements [first, first + count) widened to fp32 (exactly).
  void to_f32(size_t first, size_t count, float* dst) const;
  std::vector<float> to_f32() const;  // all of them (calibration's per-layer W_O; tests)
  // The mapped pages of the tensor leave the process's resident set (the page cache keeps them; a later read faults
  // them back): the GPU upload calls it once a tensor is on the device. Nothing for owned memory.
  void release() const;
};

// hidden = hidden_size, d = head_dim, inter = intermediate_size; "empty" = a vector of size 0 / an empty view.
struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden] input_layernorm, fp32
  WeightTensor wq;               // [n_heads * d, hidden]
  WeightTensor wk;               // [n_kv_heads * d, hidden]
  WeightTensor wv;               // [n_kv_heads * d, hidden]
  std::vector<float> bq;         // [n_heads * d] fp32, Qwen2 only, else empty
  std::vector<float> bk;         // [n_kv_heads * d] fp32, Qwen2 only, else empty
  std::vector<float> bv;         // [n_kv_heads * d] fp32, Qwen2 only, else empty
  std::vector<float> q_norm;     // [d] fp32, Qwen3 only (per-head RMSNorm weight), else empty
  std::vector<float> k_norm;     // [d] fp32, Qwen3 only, else empty
  WeightTensor wo;               // [hidden, n_heads * d]
  std::vector<float> mlp_norm;   // [hidden] post_attention_layernorm, fp32
  WeightTensor w_gate;           // [inter, hidden]
  WeightTensor w_up;             // [inter, hidden]
  WeightTensor w_down;           // [hidden, inter]
};

class Weights {
 public:
  WeightTensor embed;                // [vocab, hidden] model.embed_tokens.weight
  std::vector<float> final_norm;     // [hidden] model.norm.weight, fp32
  WeightTensor lm_head;              // [vocab, hidden]; empty when tie_embeddings (use embed)
  std::vector<LayerWeights> layers;  // n_layers entries
  size_t n_params = 0;               // number of scalars
  bool is_dummy = false;             // random (--dummy-weights): timing only

  Weights() = default;
  Weights(Weights&&) = default;
  Weights& operator=(Weights&&) = default;
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  // The output projection: lm_head, or embed when the embeddings are tied.
  const WeightTensor& output() const { return lm_head.empty() ? embed : lm_head; }
  // A matrix of the table (TensorSpec::matrix()), or a vector (a norm or a bias), by role and layer.
  const WeightTensor& matrix(TensorRole role, int layer) const;
  const std::vector<float>& vector(TensorRole role, int layer) const;
  // Any tensor of the table widened to fp32 (a copy: tests; an empty lm_head when tied gives an empty vector).
  std::vector<float> values(TensorRole role, int layer) const;
  // Host bytes the matrices take as stored (mapped or owned), and of them those the Weights own.
  size_t matrix_bytes() const;
  size_t owned_bytes() const;

  // Views of every tensor the config calls for in the checkpoint (F32 / F16 / BF16, read in place; the vectors
  // widened on n_threads threads, 0 = all cores). A missing tensor, a wrong shape or an unsupported dtype throws
  // kvq::Error naming the tensor, before any value is read. The Weights keep the checkpoint's mappings alive.
  static Weights load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads = 0);
  // Random bf16 weights of the config's shapes generated in host memory, in place (model/dummy_weights.h: the values
  // the GPU generates for the same seed), on n_threads threads. Timing only.
  static Weights dummy(const ModelConfig& cfg, uint64_t seed, int n_threads = 0);

 private:
  WeightTensor& matrix_slot(TensorRole role, int layer);
  std::vector<float>& vector_slot(TensorRole role, int layer);

  std::vector<std::shared_ptr<const SafeTensorsFile>> files_;  // the mappings the views point into
  std::vector<std::unique_ptr<uint8_t[]>> owned_;              // matrices the Weights own (dummy; misaligned)
  size_t owned_bytes_ = 0;
};

}  // namespace kvq
