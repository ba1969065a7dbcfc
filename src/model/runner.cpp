#include "model/runner.h"

#include <algorithm>

#include "common/blas_core.h"
#include "common/error.h"
#include "simd/simd.h"

namespace kvq {

int32_t argmax_row(const float* x, int n) { return int32_t(std::max_element(x, x + n) - x); }

void check_step(const Runner& r, const std::vector<int>& seqs, const std::vector<int>& n) {
  KVQ_CHECK(!seqs.empty() && seqs.size() == n.size(), "forward: {} sequences with {} token counts", seqs.size(),
            n.size());
  KVQ_CHECK(int(seqs.size()) <= r.max_seqs(), "forward: a step of {} sequences exceeds the runner's {}", seqs.size(),
            r.max_seqs());
  long rows = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    KVQ_CHECK(n[b] >= 1, "forward: sequence {} contributes {} tokens (need >= 1)", seqs[b], n[b]);
    KVQ_CHECK(n[b] <= r.cache_config().max_chunk, "forward: {} tokens of sequence {} exceed the chunk of {}", n[b],
              seqs[b], r.cache_config().max_chunk);
    for (size_t c = 0; c < b; ++c) KVQ_CHECK(seqs[c] != seqs[b], "forward: sequence {} appears twice in a step", seqs[b]);
    rows += n[b];
  }
  KVQ_CHECK(rows <= r.max_rows(), "forward: a step of {} rows exceeds the runner's {}", rows, r.max_rows());
}

void Runner::end_prompt(int seq) {
  const PromptPolicy p = cache_config().prompt_policy;
  KVQ_CHECK(p == PromptPolicy::kDecodeFaithful,
            "prompt policy '{}' is not supported by this runner ({}): only decode-faithful (the CPU cache applies the "
            "others)", prompt_policy_name(p), describe());
  KVQ_CHECK(seq >= 0 && seq < max_seqs(), "end_prompt: sequence {} out of range", seq);
}

void Runner::top_logits(int k, int32_t*, float*) {
  KVQ_FAIL("top_logits: this runner ({}) keeps no logits to select {} from", describe(), k);
}

void Runner::gumbel_argmax(const gumbel::Draw*, int32_t*) {
  KVQ_FAIL("gumbel_argmax: this runner ({}) keeps no logits to draw from", describe());
}

void Runner::row_mass(const smath::MassQuery*, smath::RowMass*) {
  KVQ_FAIL("row_mass: this runner ({}) keeps no logits to sum", describe());
}

void Runner::row_logits(int row, float*) {
  KVQ_FAIL("row_logits: this runner ({}) keeps no logits (row {})", describe(), row);
}

CacheFootprint Runner::prompt_footprint(int n_tokens, int prompt_tokens) const {
  KVQ_CHECK(cache_config().prompt_policy == PromptPolicy::kDecodeFaithful && prompt_tokens >= 0,
            "prompt policy '{}' is not supported by this runner ({})", prompt_policy_name(cache_config().prompt_policy),
            describe());
  return footprint(n_tokens);
}

namespace {
int checked_seqs(int max_seqs, size_t kv_budget_bytes) {
  KVQ_CHECK(max_seqs >= 1 || (max_seqs == 0 && kv_budget_bytes > 0),
            "CpuRunner: max_seqs {} must be >= 1 (0, as many as fit, needs a KV budget)", max_seqs);
  return max_seqs;
}
// The cache stores this model's keys: its RoPE, for key codecs that store keys without it (kv/codec_rope.h), and its
// sliding windows (Mistral), which attention reads through; and it runs at the model's SIMD level (--simd: one level
// for the whole CPU forward).
CacheConfig for_model(CacheConfig c, const Model& m) {
  c.key_rope = m.config().rope_inv_freq();
  c.attn_window = m.config().layer_window;
  c.simd = m.simd();
  return c;
}

}  // namespace

CpuRunner::CpuRunner(Model& model, const CacheConfig& cache_cfg, int max_ctx, int max_seqs, size_t kv_budget_bytes)
    : model_(model),
      cache_(for_model(cache_cfg, model), model.config().n_layers, model.config().n_kv_heads,
             model.config().head_dim, max_ctx, checked_seqs(max_seqs, kv_budget_bytes), kv_budget_bytes),
      max_seqs_(cache_.max_seqs()) {}

std::string CpuRunner::describe() const {
  return "cpu, " + std::to_string(model_.pool().size()) + " threads, " + simd_level_name(cache_.config().simd) +
         " cache kernels, OpenBLAS " + blas_core_name() + (model_.dummy() ? ", dummy weights (timing only)" : "");
}

void CpuRunner::forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
                        float* logits, int32_t* argmax) {
  check_step(*this, seqs, n);
  KVQ_CHECK(!hook_ || seqs.size() == 1, "forward: a step with a layer hook holds one sequence, not {}", seqs.size());
  model_.set_hook(hook_);
  struct Unhook {
    Model& m;
    ~Unhook() { m.set_hook(nullptr); }
  } unhook{model_};
  const int V = model_.config().vocab_size;
  const bool all = which == LogitRows::All;
  // One batched forward: the sequences' decode rows go through each linear layer together (model/model.h).
  std::vector<Model::Segment> segments;
  size_t row = 0, out_rows = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    segments.push_back({seqs[b], ids + row, n[b]});
    row += size_t(n[b]);
    out_rows += all ? size_t(n[b]) : 1;
  }
  // Where the logits go: the caller's buffer, or scratch when it wants none or only argmax.
  float* dst = (logits && which != LogitRows::None) ? logits : nullptr;
  if (!dst) {
    scratch_.resize(out_rows * size_t(V));
    dst = scratch_.data();
  }
  model_.forward(cache_, segments, dst, all);
  if (argmax && which != LogitRows::None)
    for (size_t r = 0; r < out_rows; ++r) argmax[r] = argmax_row(dst + r * size_t(V), V);
}

RunnerFactory cpu_runner_factory(Model& model) {
  return [&model](const CacheConfig& cache, int max_ctx) {
    return std::unique_ptr<Runner>(std::make_unique<CpuRunner>(model, cache, max_ctx));
  };
}

}  // namespace kvq
