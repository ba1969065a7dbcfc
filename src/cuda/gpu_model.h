// The decoder forward pass on the GPU (issue #8): the CPU Model's weights uploaded once (or dummy weights generated
// in device memory, --dummy-weights), cuBLAS GEMMs with fp32 accumulation, fp32 residual stream and norms, and the
// KV cache in GPU memory (GpuKvCache, which also applies the cache's KV transform). One forward() is one GpuKvCache
// step: chunked prefill of a sequence, or batched decode of many (model/runner.h). Same arithmetic as
// model/model.cpp, in the same order, except:
//   - GEMM precision (GemmPrecision): Bf16 rounds the GEMM inputs (activations) to bf16 — the weights are bf16 in
//     the checkpoint, so only the activation rounding differs from the CPU; Fp32 keeps them fp32 (no TF32).
//   - reductions (GEMM dot products, attention softmax) run in another order.
//
// Per layer:  h = RMSNorm(x);  q, k, v = h W_q/k/v (+ bias);  QK-norm;  RoPE;
//             cache.append_and_attend(k, v, q) -> att (the cache applies 1/sqrt(d));  x += att W_o;
//             x += W_down(SiLU(W_gate h') * W_up h')
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "model/model.h"
#include "model/runner.h"

namespace kvq::cuda {

class GpuKvCache;

enum class GemmPrecision {
  Bf16,  // bf16 weights and activations into the GEMM, fp32 accumulation and output (default)
  Fp32,  // fp32 weights (the bf16 checkpoint values, exactly) and activations, fp32 accumulation, no TF32
};
// "bf16" | "fp32"; anything else throws kvq::Error naming what is supported.
GemmPrecision parse_gemm_precision(std::string_view s);
std::string_view gemm_precision_name(GemmPrecision p);

// Share of the device memory free after the weights and activations that the KV cache takes by default (as vLLM's
// gpu_memory_utilization, but of the memory left, not of the total).
constexpr double kGpuMemoryUtilization = 0.90;

// --dummy-weights on the device: random weights of the config's shapes generated in device memory (the values
// Weights::dummy makes on the host for this seed, model/dummy_weights.h); nothing is read or kept on the host.
struct DeviceDummyWeights {
  uint64_t seed = 0;
};

class GpuModel final : public Runner {
 public:
  // Uploads model's weights, allocates the activations of a step's rows (max_rows: the chunks of as many sequences as
  // 4096 rows and 5% of the free memory allow, at least max(cache_cfg.max_chunk, max_seqs)), then a GpuKvCache
  // of cache_cfg (which uploads its KV transform) for max_seqs sequences of up to max_ctx tokens whose pages and
  // windows fit in kv_budget_bytes (--kv-budget-gib; it must be free), or by default in kGpuMemoryUtilization of the
  // memory free then, at most what max_seqs x max_ctx tokens need.
  // max_seqs 0 (bench decode --seqs max): as many sequences of max_ctx tokens as that budget holds once the
  // activations of as many rows are allocated (PagePool::for_budget's arithmetic); throws when not even one fits.
  // Requires a device (throws "--device cuda: ..." otherwise) and a GPU-supported cache configuration.
  // The CPU model is read only here; it need not outlive the GpuModel.
  GpuModel(const Model& model, const CacheConfig& cache_cfg, int max_ctx, int max_seqs,
           GemmPrecision gemm = GemmPrecision::Bf16, size_t kv_budget_bytes = 0);
  // The same with dummy weights generated on the device (timing only): no host model at all.
  GpuModel(const ModelConfig& cfg, DeviceDummyWeights dummy, const CacheConfig& cache_cfg, int max_ctx, int max_seqs,
           GemmPrecision gemm = GemmPrecision::Bf16, size_t kv_budget_bytes = 0);
  ~GpuModel() override;
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const ModelConfig& config() const override;
  const CacheConfig& cache_config() const override;
  std::string describe() const override;
  int max_ctx() const override;
  int max_seqs() const override;
  int max_rows() const override;
  int step_rows() const override;  // max_rows: the activations are allocated for it
  int new_sequence() override;
  void free_sequence(int seq) override;
  int length(int seq) const override;
  void fork_sequence(int src, int dst) override;
  void enable_prefix_cache() override;
  int prefix_match(const int32_t* ids, int n, int step) const override;
  void prefix_attach(int seq, const int32_t* ids, int len) override;
  void prefix_store(int seq, const int32_t* ids, int len) override;
  void prefix_count(int hit_tokens, int miss_tokens) override;
  PrefixCacheStats prefix_stats() const override;
  void forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
               float* logits, int32_t* argmax) override;
  using Runner::forward;
  int max_top_logits() const override;  // kMaxSortedTopK
  void top_logits(int k, int32_t* ids, float* logits) override;
  bool gumbel_sampling() const override;
  void gumbel_argmax(const gumbel::Draw* draws, int32_t* ids) override;
  void row_mass(const smath::MassQuery* queries, smath::RowMass* out) override;
  void row_logits(int row, float* out) override;
  // Prompt policies: decode-faithful, exact-prompt and quantize-after-prompt (GpuKvCache's twin); evict is refused at
  // construction.
  void end_prompt(int seq) override;
  CacheFootprint prompt_footprint(int n_tokens, int prompt_tokens) const override;
  void set_layer_hook(Model::LayerHook* hook) override;
  CacheFootprint footprint(int n_tokens) const override;
  size_t cache_bytes() const override;
  const PagePool& page_pool() const override;
  void synchronize() const override;
  size_t weight_bytes() const override;  // device bytes of the weights but an untied embedding table (gathered)

  GemmPrecision gemm_precision() const;
  // Decode steps (one token per sequence, no layer hook) replay a CUDA graph of the whole step once the same shape has
  // run twice (on by default); off launches every kernel directly. Results are identical either way.
  void set_cuda_graphs(bool on);
  bool cuda_graphs() const;
  int64_t cuda_graph_replays() const;  // steps run by replaying a graph (captures included)
  GpuKvCache& cache();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq::cuda
