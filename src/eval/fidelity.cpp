#include "eval/fidelity.h"

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
  return c;
}

namespace {

// Clears the model's hook and restores the method transform however the pass ends.
struct ModelStateGuard {
  Model& m;
  const std::shared_ptr<const KvTransform>& t;
  ~ModelStateGuard() {
    m.set_hook(nullptr);
    m.set_kv_transform(t);
  }
};

}  // namespace

FidelityResult lockstep_fidelity(Model& model, const CacheConfig& method, const std::vector<int32_t>& ids, int ctx,
                                 int windows, bool layers, const std::shared_ptr<const KvTransform>& method_transform,
                                 const std::function<void(int, int)>& progress) {
  const ModelConfig& mc = model.config();
  KVQ_CHECK(ctx >= 2, "fidelity: context {} is too short (need >= 2)", ctx);
  KVQ_CHECK(ctx <= mc.max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx, mc.max_ctx);
  const int available = int(ids.size() / size_t(ctx));
  KVQ_CHECK(available >= 1, "fidelity: the text has {} tokens, fewer than one window of {}", ids.size(), ctx);
  const int n_windows = windows > 0 ? std::min(windows, available) : available;
  const CacheConfig ref_cfg = bf16_reference_cache(method);
  const int V = mc.vocab_size, chunk = method.max_chunk;

  KvCache ref_cache(ref_cfg, mc.n_layers, mc.n_kv_heads, mc.head_dim, ctx);
  KvCache m_cache(method, mc.n_layers, mc.n_kv_heads, mc.head_dim, ctx);
  std::unique_ptr<KvCache> f_cache;
  if (layers) f_cache = std::make_unique<KvCache>(method, mc.n_layers, mc.n_kv_heads, mc.head_dim, ctx);
  std::vector<float> ref_logits(size_t(chunk) * V), m_logits(size_t(chunk) * V);
  std::vector<float> last(static_cast<size_t>(V));
  std::vector<double> scratch(size_t(V) * 2);
  LayerRecorder rec_ref(mc.n_layers, mc.hidden_size), rec_free(mc.n_layers, mc.hidden_size);
  LayerRecorder rec_forced(mc.n_layers, mc.hidden_size, &rec_ref);

  FidelityResult res;
  res.ctx = ctx;
  if (layers) res.layers = LayerErrorSums(mc.n_layers);
  ModelStateGuard guard{model, method_transform};
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    const int32_t* win = ids.data() + size_t(w) * ctx;
    const int sr = ref_cache.new_sequence(), sm = m_cache.new_sequence();
    const int sf = layers ? f_cache->new_sequence() : -1;
    WindowFidelity wf;
    for (int pos = 0; pos < ctx; pos += chunk) {
      const int n = std::min(chunk, ctx - pos);
      model.set_kv_transform(nullptr);
      model.set_hook(layers ? &rec_ref : nullptr);
      model.forward(ref_cache, sr, win + pos, n, ref_logits.data(), true);
      model.set_kv_transform(method_transform);
      model.set_hook(layers ? &rec_free : nullptr);
      model.forward(m_cache, sm, win + pos, n, m_logits.data(), true);
      if (layers) {
        model.set_hook(&rec_forced);
        model.forward(*f_cache, sf, win + pos, n, last.data(), false);
        res.layers.add(rec_ref, rec_forced, rec_free, n);
      }
      for (int i = 0; i < n; ++i) {
        const float* pr = ref_logits.data() + size_t(i) * V;
        const float* pm = m_logits.data() + size_t(i) * V;
        wf.kl_sum += kl_from_logits(pr, pm, V, scratch.data());
        wf.top1_agree += argmax(pr, V) == argmax(pm, V) ? 1 : 0;
        ++wf.tokens;
        if (pos + i + 1 < ctx) {
          wf.nll_ref += token_nll(pr, V, win[pos + i + 1]);
          wf.nll_method += token_nll(pm, V, win[pos + i + 1]);
          ++wf.nll_tokens;
        }
      }
    }
    ref_cache.free_sequence(sr);
    m_cache.free_sequence(sm);
    if (layers) f_cache->free_sequence(sf);
    res.windows.push_back(wf);
    if (progress) progress(w + 1, n_windows);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kvq
