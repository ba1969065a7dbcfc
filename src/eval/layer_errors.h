// Per-layer error observers for the lockstep fidelity pass (docs/guide/methods.md §8).
//
// Definitions (all against the BF16-cache pass over the same tokens, sums over every position of every window):
//   attn_local[l]  = sqrt(Σ‖y_l^forced - y_l^bf16‖² / Σ‖y_l^bf16‖²): the layer's OWN post-W_O attention-output
//                    error. y = the attention output after W_O (before the residual add). The "forced" method pass
//                    receives, at every layer, the BF16 pass's layer input (LayerRecorder in Force mode), so its
//                    cache holds the method's encoding of the exact keys/values and only this layer's cache error
//                    enters y_l.
//   attn_e2e[l]    = the same ratio for the free-running method pass (errors of earlier layers included).
//   hidden[l]      = sqrt(Σ‖h_l^method - h_l^bf16‖² / Σ‖h_l^bf16‖²), h_l = the residual stream after layer l (after
//                    its MLP), free-running method pass: the accumulated hidden-state error after the layer.
#pragma once

#include <vector>

#include "common/thread_pool.h"
#include "model/model.h"

namespace kvq {

// Records a chunk's per-layer residual input, post-W_O attention output and residual output. In Force mode it
// overwrites each layer's input with the input recorded by another recorder (same chunk) before the layer runs.
class LayerRecorder : public Model::LayerHook {
 public:
  LayerRecorder(int n_layers, int hidden, const LayerRecorder* force_from = nullptr);

  void on_layer_input(int layer, int pos0, int n, float* x) override;
  void on_attention_output(int layer, int pos0, int n, const float* y) override;
  void on_layer_output(int layer, int pos0, int n, const float* x) override;
  bool rewrites_input() const override { return force_ != nullptr; }

  const std::vector<float>& input(int l) const { return input_[size_t(l)]; }   // [n, hidden]
  const std::vector<float>& attn(int l) const { return attn_[size_t(l)]; }     // [n, hidden]
  const std::vector<float>& output(int l) const { return output_[size_t(l)]; } // [n, hidden]

 private:
  int hidden_;
  const LayerRecorder* force_;                  // not owned; null: record only
  std::vector<std::vector<float>> input_, attn_, output_;  // [n_layers][n * hidden] of the last chunk
};

// Running sums of squares per layer (see the header comment for the ratios).
struct LayerErrorSums {
  std::vector<double> attn_ref_sq;     // [n_layers] Σ‖y^bf16‖²
  std::vector<double> attn_local_sq;   // [n_layers] Σ‖y^forced - y^bf16‖²
  std::vector<double> attn_e2e_sq;     // [n_layers] Σ‖y^method - y^bf16‖²
  std::vector<double> hidden_ref_sq;   // [n_layers] Σ‖h^bf16‖²
  std::vector<double> hidden_diff_sq;  // [n_layers] Σ‖h^method - h^bf16‖²
  int64_t tokens = 0;                  // positions accumulated

  explicit LayerErrorSums(int n_layers = 0);
  // Adds one chunk: ref = BF16 pass, forced = method pass with BF16 inputs, free = free-running method pass. Each of
  // the 5 · n_layers sums is one task on pool's threads (null: the calling thread), summed in the same order either
  // way.
  void add(const LayerRecorder& ref, const LayerRecorder& forced, const LayerRecorder& free, int n_tokens,
           ThreadPool* pool = nullptr);
  void merge(const LayerErrorSums& o);
  double attn_local(int l) const;
  double attn_e2e(int l) const;
  double hidden(int l) const;
};

}  // namespace kvq
