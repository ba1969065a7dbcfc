#include "eval/fidelity.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "eval/metrics.h"
#include "eval/perplexity.h"

namespace kvq {

CacheConfig bf16_reference_cache(const CacheConfig& method) {
  CacheConfig c = method;
  c.k = CodecSpec{};
  c.v = CodecSpec{};
  c.k.type = c.v.type = "bf16";
  c.window = "bf16";
  c.skip_layers.clear();  // bf16 everywhere already
  c.transform = nullptr;  // the reference stores the plain keys and values
  c.kv_scales = nullptr;  // at no FP8 scale
  c.prompt_policy = PromptPolicy::kDecodeFaithful;
  c.evict_bits = 0;
  c.evict_ctx = 0;
  return c;
}

FidelityResult lockstep_fidelity(const LockstepRunners& runners, const std::vector<int32_t>& ids, int ctx, int windows,
                                 ThreadPool* pool, const std::function<void(int, int)>& progress, int prompt_tokens,
                                 int tail) {
  KVQ_CHECK(runners.ref && runners.method, "fidelity: the reference and method runners are required");
  Runner& ref = *runners.ref;
  Runner& method = *runners.method;
  Runner* forced = runners.forced;
  const ModelConfig& mc = method.config();
  KVQ_CHECK(ctx >= 2, "fidelity: context {} is too short (need >= 2)", ctx);
  KVQ_CHECK(ctx <= mc.max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx, mc.max_ctx);
  for (const Runner* r : std::initializer_list<const Runner*>{&ref, &method, forced})
    KVQ_CHECK(!r || r->max_ctx() >= ctx, "fidelity: context {} exceeds a runner's {} tokens", ctx, r->max_ctx());
  const int available = int(ids.size() / size_t(ctx));
  KVQ_CHECK(available >= 1, "fidelity: the text has {} tokens, fewer than one window of {}", ids.size(), ctx);
  const int n_windows = windows > 0 ? std::min(windows, available) : available;
  const int V = mc.vocab_size;
  const int chunk = std::min(ref.cache_config().max_chunk, method.cache_config().max_chunk);
  const bool layers = forced != nullptr;
  const int P = prompt_tokens;
  scored_targets(ctx, P);  // 0 <= P < ctx
  check_tail(ctx, P, tail);
  const int first = first_scored_row(P), first_tail = tail > 0 ? first_scored_row(tail) : ctx;

  std::vector<float> ref_logits(size_t(chunk) * V), m_logits(size_t(chunk) * V);
  const int n_threads = pool ? pool->size() : 1;
  std::vector<std::vector<double>> scratch(size_t(n_threads), std::vector<double>(static_cast<size_t>(V)));
  std::vector<WindowFidelity> per_row(static_cast<size_t>(chunk));  // one row's contribution, summed in row order
  LayerRecorder rec_ref(mc.n_layers, mc.hidden_size), rec_free(mc.n_layers, mc.hidden_size);
  LayerRecorder rec_forced(mc.n_layers, mc.hidden_size, &rec_ref);

  FidelityResult res;
  res.ctx = ctx;
  res.prompt_tokens = P;
  if (layers) res.layers = LayerErrorSums(mc.n_layers);
  struct Unhook {  // however the pass ends, no runner keeps a hook into this frame
    const LockstepRunners& r;
    ~Unhook() {
      for (Runner* x : {r.ref, r.method, r.forced})
        if (x) x->set_layer_hook(nullptr);
    }
  } unhook{runners};
  ref.set_layer_hook(layers ? &rec_ref : nullptr);
  method.set_layer_hook(layers ? &rec_free : nullptr);
  if (layers) forced->set_layer_hook(&rec_forced);
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    const int32_t* win = ids.data() + size_t(w) * ctx;
    const int sr = ref.new_sequence(), sm = method.new_sequence();
    const int sf = layers ? forced->new_sequence() : -1;
    WindowFidelity wf;
    // Chunks of [pos, end): the prompt, then what follows it.
    const auto run_span = [&](int pos, int end) {
      for (; pos < end; pos += chunk) {
        const int n = std::min(chunk, end - pos);
        ref.forward(sr, win + pos, n, ref_logits.data(), true);
        method.forward(sm, win + pos, n, m_logits.data(), true);
        if (layers) {
          forced->forward({sf}, {n}, win + pos, LogitRows::None, nullptr, nullptr);
          res.layers.add(rec_ref, rec_forced, rec_free, n, pool);
        }
        const int i0 = std::clamp(first - pos, 0, n);  // rows before it predict prompt tokens: not compared
        auto compare = [&](int64_t i, int thread) {
          const float* pr = ref_logits.data() + size_t(i) * V;
          const float* pm = m_logits.data() + size_t(i) * V;
          const int32_t target = pos + i + 1 < ctx ? win[pos + i + 1] : -1;
          const RowFidelity f = row_fidelity(pr, pm, V, target, scratch[size_t(thread)].data());
          WindowFidelity& o = per_row[size_t(i)];
          o = WindowFidelity{};
          o.kl_sum = f.kl;
          o.top1_agree = f.top1_agree ? 1 : 0;
          if (target >= 0) {
            o.nll_ref = f.nll_p;
            o.nll_method = f.nll_q;
            o.nll_tokens = 1;
          }
        };
        if (pool) pool->parallel_for(n - i0, [&](int64_t i, int thread) { compare(i0 + i, thread); });
        else for (int i = i0; i < n; ++i) compare(i, 0);
        for (int i = i0; i < n; ++i) {  // the same summation order on any number of threads
          const WindowFidelity& o = per_row[size_t(i)];
          wf.kl_sum += o.kl_sum;
          wf.top1_agree += o.top1_agree;
          ++wf.tokens;
          wf.nll_ref += o.nll_ref;
          wf.nll_method += o.nll_method;
          wf.nll_tokens += o.nll_tokens;
          if (pos + i >= first_tail) {
            wf.nll_method_tail += o.nll_method;
            wf.kl_sum_tail += o.kl_sum;
            wf.top1_agree_tail += o.top1_agree;
            ++wf.tokens_tail;
          }
        }
      }
    };
    run_span(0, P);
    ref.end_prompt(sr);
    method.end_prompt(sm);
    if (layers) forced->end_prompt(sf);
    run_span(P, ctx);
    ref.free_sequence(sr);
    method.free_sequence(sm);
    if (layers) forced->free_sequence(sf);
    res.windows.push_back(wf);
    if (progress) progress(w + 1, n_windows);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvq
