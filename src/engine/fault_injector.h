// A test hook for the engine's failure paths: a Runner that forwards everything to the runner it wraps and, when
// armed, makes its next forward() throw, as a failing step would. kvq serve wraps its runner in one only with
// --test-hooks (POST /debug/fault arms it); the server tests wrap the CPU runner. The step really fails: the engine's
// recovery (Scheduler::step, Engine) is what runs, on the real runner underneath.
#pragma once

#include <atomic>
#include <string_view>

#include "model/runner.h"

namespace kvq {

enum class Fault : int {
  kNone,
  kError,       // a kvq::Error, as a failed check in a step
  kBadAlloc,    // std::bad_alloc, as an allocation that fails
  kDeviceLost,  // DeviceLost, as a sticky CUDA error (an illegal address)
};
// "error" | "bad_alloc" | "device_lost"; kvq::Error naming the known ones.
Fault parse_fault(std::string_view name);

class FaultInjectingRunner final : public Runner {
 public:
  explicit FaultInjectingRunner(Runner& inner) : inner_(inner) {}

  // The next forward() throws f (before it touches the cache), once; then forward() works again (kDeviceLost: the
  // engine never calls it again).
  void arm(Fault f) { armed_ = int(f); }
  int64_t injected() const { return injected_; }  // faults thrown so far

  const ModelConfig& config() const override { return inner_.config(); }
  const CacheConfig& cache_config() const override { return inner_.cache_config(); }
  std::string describe() const override { return inner_.describe() + ", fault injection (--test-hooks)"; }
  int max_ctx() const override { return inner_.max_ctx(); }
  int max_seqs() const override { return inner_.max_seqs(); }
  int max_rows() const override { return inner_.max_rows(); }
  int step_rows() const override { return inner_.step_rows(); }
  int new_sequence() override { return inner_.new_sequence(); }
  void free_sequence(int seq) override { inner_.free_sequence(seq); }
  int length(int seq) const override { return inner_.length(seq); }
  void fork_sequence(int src, int dst) override { inner_.fork_sequence(src, dst); }
  void enable_prefix_cache() override { inner_.enable_prefix_cache(); }
  int prefix_match(const int32_t* ids, int n, int step) const override { return inner_.prefix_match(ids, n, step); }
  void prefix_attach(int seq, const int32_t* ids, int len) override { inner_.prefix_attach(seq, ids, len); }
  void prefix_store(int seq, const int32_t* ids, int len) override { inner_.prefix_store(seq, ids, len); }
  void prefix_count(int hit_tokens, int miss_tokens) override { inner_.prefix_count(hit_tokens, miss_tokens); }
  PrefixCacheStats prefix_stats() const override { return inner_.prefix_stats(); }
  void forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
               float* logits, int32_t* argmax) override;
  using Runner::forward;
  int max_top_logits() const override { return inner_.max_top_logits(); }
  void top_logits(int k, int32_t* ids, float* logits) override { inner_.top_logits(k, ids, logits); }
  bool gumbel_sampling() const override { return inner_.gumbel_sampling(); }
  void gumbel_argmax(const gumbel::Draw* draws, int32_t* ids) override { inner_.gumbel_argmax(draws, ids); }
  void row_mass(const smath::MassQuery* queries, smath::RowMass* out) override { inner_.row_mass(queries, out); }
  void row_logits(int row, float* out) override { inner_.row_logits(row, out); }
  void end_prompt(int seq) override { inner_.end_prompt(seq); }
  CacheFootprint prompt_footprint(int n_tokens, int prompt_tokens) const override {
    return inner_.prompt_footprint(n_tokens, prompt_tokens);
  }
  void set_layer_hook(Model::LayerHook* hook) override { inner_.set_layer_hook(hook); }
  CacheFootprint footprint(int n_tokens) const override { return inner_.footprint(n_tokens); }
  size_t cache_bytes() const override { return inner_.cache_bytes(); }
  const PagePool& page_pool() const override { return inner_.page_pool(); }
  size_t weight_bytes() const override { return inner_.weight_bytes(); }
  void synchronize() const override { inner_.synchronize(); }

 private:
  Runner& inner_;
  std::atomic<int> armed_{int(Fault::kNone)};
  std::atomic<int64_t> injected_{0};
};

}  // namespace kvq
