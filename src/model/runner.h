// Runner: the one host-side interface the model commands (run, ppl, bench decode) drive, whatever the device.
// A runner owns a model's KV cache and runs forward steps over a batch of sequences: sequence seqs[b] contributes
// n[b] new tokens at positions [length(seqs[b]), + n[b]) and the ids of all sequences are concatenated (row r of
// the step belongs to one (b, i)). Decode is n[b] = 1 for every b; prefill is one sequence with n = a chunk.
//
// Implementations: CpuRunner (below: Model + KvCache, one sequence after another) and cuda::GpuModel
// (src/cuda/gpu_model.h: batched on the GPU through GpuKvCache).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "model/config.h"
#include "model/gumbel.h"
#include "model/model.h"

namespace kvq {

// Which logits a step returns.
enum class LogitRows {
  None,  // no logits (prefill whose predictions are not needed)
  Last,  // [n_seqs, vocab]: the last row of each sequence, in the order of seqs
  All,   // [Σ n, vocab]: every row of the step
};

class Runner {
 public:
  virtual ~Runner() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const CacheConfig& cache_config() const = 0;
  virtual std::string describe() const = 0;  // "cpu, 2 threads, avx512vnni cache kernels" / "cuda: NVIDIA H200 ..."
  virtual int max_ctx() const = 0;           // tokens per sequence at most
  virtual int max_seqs() const = 0;          // live sequences at most
  virtual int max_rows() const = 0;          // Σ n of one step at most (and n[b] <= cache_config().max_chunk)
  // The rows a step is sized for (at most max_rows): the scheduler's default token budget is this or one chunk plus
  // one token per sequence, whichever is larger. Default: one chunk.
  virtual int step_rows() const { return cache_config().max_chunk; }

  virtual int new_sequence() = 0;
  virtual void free_sequence(int seq) = 0;
  virtual int length(int seq) const = 0;  // tokens committed
  // dst (a new sequence, empty) becomes a copy of src's cache, pages of its own included (n > 1 choices of one
  // prefill). kvq::Error when the pool lacks the pages (before anything changes) or the cache cannot fork.
  virtual void fork_sequence(int src, int dst) = 0;
  // Prefix caching (kv/prefix_cache.h, the cache's own: KvCache's, GpuKvCache's), off until enabled (kvq serve: on
  // unless --no-prefix-cache). prefix_match: the longest cached prefix of ids [0, n) a new sequence can continue from
  // (a multiple of step, at most n - 1; 0 when none or off); prefix_attach: seq (new, empty) continues from it;
  // prefix_store: caches seq's state as the prefix ids [0, length(seq)); prefix_count: hit / prefilled prompt tokens.
  virtual void enable_prefix_cache() = 0;
  virtual int prefix_match(const int32_t* ids, int n, int step) const = 0;
  virtual void prefix_attach(int seq, const int32_t* ids, int len) = 0;
  virtual void prefix_store(int seq, const int32_t* ids, int len) = 0;
  virtual void prefix_count(int hit_tokens, int miss_tokens) = 0;
  virtual PrefixCacheStats prefix_stats() const = 0;

  // One step (see the header comment). logits: null, or room for the rows `which` names. argmax: null, or
  // room for one id per returned row: the index of the row's largest logit (lowest index on ties), computed
  // where the logits are (no copy of them needed). which == None ignores both.
  virtual void forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
                       float* logits, int32_t* argmax) = 0;

  // The k largest logits of each row the last forward() returned (at most max_seqs() rows), ids[r·k + i] and
  // logits[r·k + i] in the sampler's order (larger first, lower id on ties: model/sampler.h): what sampling with a
  // small top_k reads instead of the whole row, selected where the logits are. 1 <= k <= max_top_logits(); a runner
  // that keeps no logits (the CPU's, which hands them out whole) has max_top_logits() 0 and refuses the call.
  virtual int max_top_logits() const { return 0; }
  virtual void top_logits(int k, int32_t* ids, float* logits);
  // The token each row the last forward() returned draws at a temperature by the Gumbel-max trick (model/gumbel.h:
  // Sampler::draws_by_gumbel), row r with draws[r]: the same token as the host's Sampler::sample on that row. A runner
  // that keeps no logits has gumbel_sampling() false and refuses the call.
  virtual bool gumbel_sampling() const { return false; }
  virtual void gumbel_argmax(const gumbel::Draw* draws, int32_t* ids);
  // With top_logits, for a top_p / min_p draw over the whole vocabulary (Sampler::needs_row_mass): each returned row's
  // mass at queries[r] (the sum of exp((logit - max) / T) in smath's order and how many weigh >= min_p), the host's
  // bits; and a row's logits when its nucleus reaches past its largest (row < the rows the last forward returned).
  // Refused by a runner that keeps no logits (max_top_logits() 0).
  virtual void row_mass(const smath::MassQuery* queries, smath::RowMass* out);
  virtual void row_logits(int row, float* out);

  // The end of seq's prompt: the cache applies its prompt policy (CacheConfig::prompt_policy, kv/cache.h). The
  // default (a runner whose cache only reads decode-faithfully, the GPU's) accepts only decode-faithful.
  virtual void end_prompt(int seq);
  // footprint() of a sequence whose first prompt_tokens were its prompt, under the cache's prompt policy.
  virtual CacheFootprint prompt_footprint(int n_tokens, int prompt_tokens) const;

  // Single-sequence convenience: logits [n, vocab] when all_logits, else [vocab] of the last token.
  void forward(int seq, const int32_t* ids, int n, float* logits, bool all_logits) {
    forward({seq}, {n}, ids, all_logits ? LogitRows::All : LogitRows::Last, logits, nullptr);
  }

  // Residual-stream observer (Model::LayerHook: each layer's input, which it may overwrite, its post-W_O attention
  // output and its output) for the following forward() calls; null: none. A step with a hook holds one sequence.
  // On the GPU the hook sees host copies, and an overwritten input is uploaded back before the layer runs.
  virtual void set_layer_hook(Model::LayerHook* hook) = 0;

  // The cache's own accounting (same structs on both devices) and the bytes it holds.
  virtual CacheFootprint footprint(int n_tokens) const = 0;
  virtual size_t cache_bytes() const = 0;
  // The cache's page pool (kv/page_pool.h, the same on both devices): pages and slots used and free, admission.
  virtual const PagePool& page_pool() const = 0;
  virtual size_t weight_bytes() const = 0;  // bytes of the weights the forward pass reads (per step, once)

  // Waits until the work queued by forward() has finished (timing); forward() returning logits has waited already.
  virtual void synchronize() const {}
};

// Builds a runner for one pass of an evaluation: its cache (with its KV transform) and the longest sequence.
// The one place where evaluation code meets a device (cpu_runner_factory below; the CLI's --device cuda one).
using RunnerFactory = std::function<std::unique_ptr<Runner>(const CacheConfig& cache, int max_ctx)>;

// The CPU path: Model::forward over a KvCache, one sequence of the step after another.
class CpuRunner final : public Runner {
 public:
  // The model must outlive the runner; runners with different caches (and KV transforms) can share one model.
  // The cache holds max_seqs sequences of up to max_ctx tokens; with kv_budget_bytes > 0 (--kv-budget-gib) its pool
  // is as many pages as that many bytes hold, which every sequence's windows also come from (KvCache). max_seqs 0
  // (needs a budget): as many sequences of max_ctx tokens as the budget holds (PagePool::for_budget; bench decode
  // --seqs max).
  CpuRunner(Model& model, const CacheConfig& cache_cfg, int max_ctx, int max_seqs = 1, size_t kv_budget_bytes = 0);

  const ModelConfig& config() const override { return model_.config(); }
  const CacheConfig& cache_config() const override { return cache_.config(); }
  std::string describe() const override;
  int max_ctx() const override { return cache_.max_ctx(); }
  int max_seqs() const override { return max_seqs_; }
  int max_rows() const override { return cache_.config().max_chunk * max_seqs_; }
  int new_sequence() override { return cache_.new_sequence(); }
  void free_sequence(int seq) override { cache_.free_sequence(seq); }
  int length(int seq) const override { return cache_.length(seq); }
  void fork_sequence(int src, int dst) override { cache_.fork(src, dst); }
  void enable_prefix_cache() override { cache_.enable_prefix_cache(); }
  int prefix_match(const int32_t* ids, int n, int step) const override { return cache_.prefix_match(ids, n, step); }
  void prefix_attach(int seq, const int32_t* ids, int len) override { cache_.prefix_attach(seq, ids, len); }
  void prefix_store(int seq, const int32_t* ids, int len) override { cache_.prefix_store(seq, ids, len); }
  void prefix_count(int hit_tokens, int miss_tokens) override { cache_.prefix_count(hit_tokens, miss_tokens); }
  PrefixCacheStats prefix_stats() const override { return cache_.prefix_stats(); }
  void forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
               float* logits, int32_t* argmax) override;
  using Runner::forward;
  void set_layer_hook(Model::LayerHook* hook) override { hook_ = hook; }
  void end_prompt(int seq) override { cache_.end_prompt(seq); }
  CacheFootprint prompt_footprint(int n_tokens, int prompt_tokens) const override {
    return cache_.footprint(n_tokens, prompt_tokens);
  }
  CacheFootprint footprint(int n_tokens) const override { return cache_.footprint(n_tokens); }
  size_t cache_bytes() const override { return cache_.bytes_allocated(); }
  const PagePool& page_pool() const override { return cache_.pool(); }
  size_t weight_bytes() const override { return model_.decode_weight_bytes(); }

  KvCache& cache() { return cache_; }
  Model& model() { return model_; }

 private:
  Model& model_;
  Model::LayerHook* hook_ = nullptr;              // installed on model_ for each step, removed after it
  KvCache cache_;
  int max_seqs_;
  std::vector<float> scratch_;  // [max_chunk, vocab] logits of one sequence when the caller wants none / argmax only
};

// CpuRunners over model (sharing its thread pool); the model must outlive them.
RunnerFactory cpu_runner_factory(Model& model);

// Index of the largest of x[0..n) (the first on ties), as std::max_element.
int32_t argmax_row(const float* x, int n);

// Checks a step's shape against a runner's limits before any work: one kvq::Error naming what is wrong.
void check_step(const Runner& r, const std::vector<int>& seqs, const std::vector<int>& n);

}  // namespace kvq
