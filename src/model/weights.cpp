#include "model/weights.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace kvq {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

// Runs fn(i) for i in [0, n) on n_threads threads (the caller's included), items taken in order from a shared
// counter; the first exception stops the remaining items and is rethrown.
template <class Fn>
void parallel_for(size_t n, int n_threads, Fn&& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::min<int>(n_threads, int(std::max<size_t>(n, 1))); ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// One tensor to fill: its size, its destination, and how a range of it is written.
struct FillJob {
  size_t numel;
  std::vector<float>* dst;                                          // sized in run_fill()
  std::function<void(size_t first, size_t count, float* out)> fill;  // writes out[0, count) = elements [first, +count)
};

// Allocates the destinations (largest first: first-touch page faults dominate, so they are spread over the threads
// too), then fills them in chunks of kChunk elements so threads stay balanced.
void run_fill(const std::vector<FillJob>& jobs, int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<const FillJob*> by_size;
  for (const FillJob& job : jobs) by_size.push_back(&job);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [](const FillJob* a, const FillJob* b) { return a->numel > b->numel; });
  parallel_for(by_size.size(), n_threads, [&](size_t i) { by_size[i]->dst->assign(by_size[i]->numel, 0.0f); });

  constexpr size_t kChunk = size_t(1) << 20;
  struct Item {
    const FillJob* job;
    size_t first, count;  // element range of the tensor
  };
  std::vector<Item> items;
  for (const FillJob& job : jobs)
    for (size_t first = 0; first < job.numel; first += kChunk)
      items.push_back({&job, first, std::min(kChunk, job.numel - first)});
  parallel_for(items.size(), n_threads, [&](size_t i) {
    const Item& it = items[i];
    it.job->fill(it.first, it.count, it.job->dst->data() + it.first);
  });
}

// Checks the presence, dtype and shape of every tensor before any allocation or conversion.
FillJob load_job(const Checkpoint& ckpt, const TensorSpec& spec, std::vector<float>* dst) {
  const TensorRef ref = ckpt.get(spec.name);
  const DType dt = ref.info->dtype;
  if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16) {
    throw Error(fmt::format("tensor '{}' in {} has dtype {}; weights must be F32, F16 or BF16", spec.name, ckpt.dir(),
                            dtype_name(dt)),
                ckpt.dir());
  }
  if (ref.info->shape != spec.shape) {
    throw Error(fmt::format("tensor '{}' in {} has shape {}, expected {}", spec.name, ckpt.dir(),
                            shape_str(ref.info->shape), shape_str(spec.shape)),
                ckpt.dir());
  }
  return {size_t(ref.info->numel()), dst, [ref](size_t first, size_t count, float* out) {
            to_f32(ref, first, count, out);
          }};
}

}  // namespace

size_t TensorSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::vector<TensorSpec> model_tensors(const ModelConfig& cfg) {
  const int64_t hidden = cfg.hidden_size, d = cfg.head_dim, inter = cfg.intermediate_size;
  const int64_t q_dim = int64_t(cfg.n_heads) * d, kv_dim = int64_t(cfg.n_kv_heads) * d;
  using R = TensorRole;
  using I = TensorInit;
  std::vector<TensorSpec> t;
  auto add = [&](R role, int layer, std::string name, std::vector<int64_t> shape, I init) {
    t.push_back({role, layer, std::move(name), std::move(shape), init});
  };
  add(R::Embed, -1, "model.embed_tokens.weight", {cfg.vocab_size, hidden}, I::Normal);
  add(R::FinalNorm, -1, "model.norm.weight", {hidden}, I::Ones);
  if (!cfg.tie_embeddings) add(R::LmHead, -1, "lm_head.weight", {cfg.vocab_size, hidden}, I::Normal);
  for (int i = 0; i < cfg.n_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(R::AttnNorm, i, p + "input_layernorm.weight", {hidden}, I::Ones);
    add(R::Wq, i, p + "self_attn.q_proj.weight", {q_dim, hidden}, I::Normal);
    add(R::Wk, i, p + "self_attn.k_proj.weight", {kv_dim, hidden}, I::Normal);
    add(R::Wv, i, p + "self_attn.v_proj.weight", {kv_dim, hidden}, I::Normal);
    if (cfg.qkv_bias) {
      add(R::Bq, i, p + "self_attn.q_proj.bias", {q_dim}, I::Zeros);
      add(R::Bk, i, p + "self_attn.k_proj.bias", {kv_dim}, I::Zeros);
      add(R::Bv, i, p + "self_attn.v_proj.bias", {kv_dim}, I::Zeros);
    }
    if (cfg.qk_norm) {
      add(R::QNorm, i, p + "self_attn.q_norm.weight", {d}, I::Ones);
      add(R::KNorm, i, p + "self_attn.k_norm.weight", {d}, I::Ones);
    }
    add(R::Wo, i, p + "self_attn.o_proj.weight", {hidden, q_dim}, I::Normal);
    add(R::MlpNorm, i, p + "post_attention_layernorm.weight", {hidden}, I::Ones);
    add(R::WGate, i, p + "mlp.gate_proj.weight", {inter, hidden}, I::Normal);
    add(R::WUp, i, p + "mlp.up_proj.weight", {inter, hidden}, I::Normal);
    add(R::WDown, i, p + "mlp.down_proj.weight", {hidden, inter}, I::Normal);
  }
  return t;
}

size_t model_params(const ModelConfig& cfg) {
  size_t n = 0;
  for (const TensorSpec& s : model_tensors(cfg)) n += s.numel();
  return n;
}

std::vector<float>& Weights::tensor(TensorRole role, int layer) {
  using R = TensorRole;
  switch (role) {
    case R::Embed: return embed;
    case R::FinalNorm: return final_norm;
    case R::LmHead: return lm_head;
    default: break;
  }
  KVQ_CHECK(layer >= 0 && size_t(layer) < layers.size(), "weights: layer {} of {}", layer, layers.size());
  LayerWeights& l = layers[size_t(layer)];
  switch (role) {
    case R::AttnNorm: return l.attn_norm;
    case R::Wq: return l.wq;
    case R::Wk: return l.wk;
    case R::Wv: return l.wv;
    case R::Bq: return l.bq;
    case R::Bk: return l.bk;
    case R::Bv: return l.bv;
    case R::QNorm: return l.q_norm;
    case R::KNorm: return l.k_norm;
    case R::Wo: return l.wo;
    case R::MlpNorm: return l.mlp_norm;
    case R::WGate: return l.w_gate;
    case R::WUp: return l.w_up;
    case R::WDown: return l.w_down;
    default: break;
  }
  KVQ_FAIL("weights: tensor role {} is not a layer's", int(role));
}

const std::vector<float>& Weights::tensor(TensorRole role, int layer) const {
  return const_cast<Weights*>(this)->tensor(role, layer);
}

Weights Weights::load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads) {
  Weights w;
  w.layers.resize(size_t(cfg.n_layers));
  std::vector<FillJob> jobs;
  for (const TensorSpec& spec : model_tensors(cfg)) {
    jobs.push_back(load_job(ckpt, spec, &w.tensor(spec.role, spec.layer)));
    w.n_params += jobs.back().numel;
  }
  run_fill(jobs, n_threads);
  return w;
}

Weights Weights::dummy(const ModelConfig& cfg, uint64_t seed, int n_threads) {
  Weights w;
  w.layers.resize(size_t(cfg.n_layers));
  w.is_dummy = true;
  std::vector<FillJob> jobs;
  for (const TensorSpec& spec : model_tensors(cfg)) {
    const float std = cfg.initializer_range;
    jobs.push_back({spec.numel(), &w.tensor(spec.role, spec.layer),
                    [init = spec.init, stream = spec.stream(), std, seed](size_t first, size_t count, float* out) {
                      for (size_t i = 0; i < count; ++i) out[i] = dummy_value(init, std, seed, stream, first + i);
                    }});
    w.n_params += spec.numel();
  }
  run_fill(jobs, n_threads);
  return w;
}

}  // namespace kvq
