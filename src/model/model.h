// The decoder-only transformer (Qwen3, Qwen2, Llama 2 / 3, Mistral) on CPU: weights read where they lie in the
// checkpoint's mapping (model/weights.h), fp32 activations, bf16 weight rows read by the row kernels for decode steps
// and OpenBLAS GEMMs on widened tiles for prefill (model/linear.h), chunked prefill and decode through the paged KV
// cache; sliding-window attention (Mistral) through the cache's windows (CacheConfig::attn_window).
//
// Per layer:  h = RMSNorm(x);  q, k, v = h W_q/k/v (+ bias);  QK-norm (Qwen3);  RoPE;  append k, v to the cache;
//             x += Attention(q, cache) W_o;  x += W_down(SiLU(W_gate h') * W_up h'),  h' = RMSNorm(x)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "common/thread_pool.h"
#include "kv/cache.h"
#include "kv/transform.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/safetensors.h"
#include "model/value_fold.h"
#include "model/weights.h"

namespace kvq {

class Model {
 public:
  // Loads config.json and the safetensors weights of a Hugging Face checkpoint directory. n_threads <= 0: all cores.
  // simd: the level of the linear layers' bf16 row kernels (--simd; the cache has its own, CacheConfig::simd).
  static std::unique_ptr<Model> load(const std::string& dir, int n_threads, SimdLevel simd = best_simd_level());
  // Random weights of cfg's shapes in host memory (Weights::dummy; --dummy-weights --device cpu): timing only.
  // dir is where cfg came from (messages); no checkpoint is read.
  static std::unique_ptr<Model> dummy(const std::string& dir, const ModelConfig& cfg, uint64_t seed, int n_threads,
                                      SimdLevel simd = best_simd_level());

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  size_t decode_weight_bytes() const;  // weight bytes one decode step reads (as stored: bf16 at 2 bytes)
  const std::string& dir() const { return dir_; }
  const std::string& fingerprint() const { return fingerprint_; }  // sha256 of config + tensor headers; dummy: ""
  bool dummy() const { return w_.is_dummy; }  // random weights: timing only
  ThreadPool& pool() { return pool_; }
  SimdLevel simd() const { return simd_; }
  double load_seconds() const { return load_seconds_; }

  // Runs ids[0..n) at positions [cache.length(seq), + n) and appends their keys and values to the cache, transformed
  // by the cache's KV transform (CacheConfig::transform: centring, rotations) when it has one.
  // logits: [n, vocab] when all_logits, else [vocab] for the last token. n <= cache.config().max_chunk.
  void forward(KvCache& cache, int seq, const int32_t* ids, int n, float* logits, bool all_logits);

  // The tokens of one sequence in a batched step.
  struct Segment {
    int seq;              // cache sequence
    const int32_t* ids;   // [n] token ids, at positions [cache.length(seq), + n)
    int n;                // tokens, <= cache.config().max_chunk
  };
  // A step of several sequences: their rows go through every linear layer together (one read of the weights for
  // the whole step: GEMM rows, not a GEMV per sequence), attention runs per sequence over its own cache rows.
  // logits: [Σ n, vocab] in segment order when all_logits, else [segments, vocab] (each one's last token). The same
  // maths per row as one forward per sequence (the linear layers' row kernels read each row alike in any batch).
  // A layer hook (set_hook) needs a step of one sequence.
  void forward(KvCache& cache, const std::vector<Segment>& segments, float* logits, bool all_logits);

  // Observers for calibration / evaluation: called per layer with post-RoPE q [n, n_heads, d], k, v
  // [n, n_kv_heads, d] (before the cache's KV transform) and the positions. Null by default.
  struct LayerTap {
    virtual ~LayerTap() = default;
    virtual void on_qkv(int layer, int pos0, int n, const float* q, const float* k, const float* v) = 0;
  };
  void set_tap(LayerTap* tap) { tap_ = tap; }

  // Residual-stream observer for evaluation (per-layer errors): per layer, the layer's input x [n, hidden] — the
  // hook may overwrite it, e.g. to feed two caches the same layer input —, the post-W_O attention output y
  // [n, hidden] (before the residual add) and the residual stream after the layer (after the MLP) [n, hidden].
  // Null by default; when null it costs one pointer test per layer.
  struct LayerHook {
    virtual ~LayerHook() = default;
    virtual void on_layer_input(int layer, int pos0, int n, float* x) = 0;
    // Whether on_layer_input may overwrite x (a device runner then uploads it back before the layer runs).
    virtual bool rewrites_input() const { return true; }
    virtual void on_attention_output(int layer, int pos0, int n, const float* y) = 0;
    virtual void on_layer_output(int layer, int pos0, int n, const float* x) = 0;
  };
  void set_hook(LayerHook* hook) { hook_ = hook; }

  // Folds t's value rotation into W_V / W_O (model/value_fold.h; nothing when t has none or is folded already):
  // the steps of a cache that carries t then read the folded weights and skip both value rotations; a cache with any
  // other transform (or none) reads the model's own weights as before. One fold at a time: another t replaces it.
  // Not with a layer tap (it reads the values before the transform). Returns the fold, or null when t has no r_v.
  const ValueFold* fold_value_rotation(const std::shared_ptr<const KvTransform>& t);
  // The fold for a cache with transform t, or null.
  const ValueFold* value_fold(const KvTransform* t) const {
    return fold_ && t && fold_->transform.get() == t ? fold_.get() : nullptr;
  }

 private:
  Model(std::string dir, int n_threads, SimdLevel simd);
  void build_linears();  // linears_ and head_ over w_
  // Rows [row0, row0 + n) of the step are sequence seg.seq's at positions [pos0, pos0 + n).
  struct Span {
    int seq, pos0, row0, n;
  };
  void attention_block(KvCache& cache, const std::vector<Span>& spans, int layer, int rows);
  void mlp_block(int layer, int n);
  // y = layer(x) over the step's rows: the rows of the sequences with at most Linear::kGemvRows tokens (decode rows;
  // first in the step, rows [0, small_rows_)) together through Linear::apply_rows when the layer reads bf16, each
  // other sequence's rows alone through Linear::apply: every row's result is what a step of its sequence alone gives.
  void linear(const Linear& layer, const float* x, float* y);

  std::string dir_;
  ModelConfig cfg_;
  Weights w_;
  struct LayerLinears {
    Linear q, k, v, o, gate, up, down;
  };
  std::vector<LayerLinears> linears_;  // over w_'s tensors
  Linear head_;                        // the output projection
  std::unique_ptr<ValueFold> fold_;    // the value rotation folded into W_V / W_O, or null
  struct FoldedLinears {
    Linear v, o;
  };
  std::vector<FoldedLinears> fold_linears_;  // over fold_'s tensors
  std::string fingerprint_;
  ThreadPool pool_;
  SimdLevel simd_;  // the linear layers' row kernels' level
  double load_seconds_ = 0;
  std::vector<float> inv_freq_;  // [d / 2] RoPE inverse frequencies
  LayerTap* tap_ = nullptr;
  LayerHook* hook_ = nullptr;

  // Activations of the current chunk (n rows).
  std::vector<float> x_, h_;        // [n, hidden] residual stream, normed input
  std::vector<float> q_, k_, v_;    // [n, n_heads * d], [n, n_kv * d], [n, n_kv * d]
  std::vector<float> att_;          // [n, n_heads * d]
  std::vector<Span> spans_;         // the step's sequences, decode rows first
  std::vector<AppendJob> jobs_;     // a layer's appends and attention over spans_ (rounds for the whole step)
  int small_rows_ = 0;              // rows [0, small_rows_): sequences of at most Linear::kGemvRows tokens
  std::vector<float> gate_, up_;    // [n, intermediate]
};

}  // namespace kvq
