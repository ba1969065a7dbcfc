#include "model/weights.h"

#include <algorithm>
#include <atomic>
#include <exception>
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

// One tensor to convert: where it comes from and where it goes.
struct LoadJob {
  TensorRef src;            // tensor in the mapping
  std::vector<float>* dst;  // destination, sized in run()
};

// Collects the tensors of a model, checking presence, dtype and shape before any allocation or conversion.
class LoadPlan {
 public:
  explicit LoadPlan(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float>* dst) {
    const TensorRef ref = ckpt_.get(name);
    const DType dt = ref.info->dtype;
    if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16) {
      throw Error(fmt::format("tensor '{}' in {} has dtype {}; weights must be F32, F16 or BF16", name, ckpt_.dir(),
                              dtype_name(dt)),
                  ckpt_.dir());
    }
    if (ref.info->shape != shape) {
      throw Error(fmt::format("tensor '{}' in {} has shape {}, expected {}", name, ckpt_.dir(),
                              shape_str(ref.info->shape), shape_str(shape)),
                  ckpt_.dir());
    }
    n_params_ += size_t(ref.info->numel());
    jobs_.push_back({ref, dst});
  }

  // Allocates the destinations (largest first: first-touch page faults dominate, so they are spread over the
  // threads too), then converts in chunks of kChunk elements so threads stay balanced.
  void run(int n_threads) {
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<const LoadJob*> by_size;
    for (const LoadJob& job : jobs_) by_size.push_back(&job);
    std::stable_sort(by_size.begin(), by_size.end(), [](const LoadJob* a, const LoadJob* b) {
      return a->src.info->numel() > b->src.info->numel();
    });
    parallel_for(by_size.size(), n_threads, [&](size_t i) {
      by_size[i]->dst->assign(size_t(by_size[i]->src.info->numel()), 0.0f);
    });

    constexpr size_t kChunk = size_t(1) << 20;
    struct Item {
      const LoadJob* job;
      size_t first, count;  // element range of the tensor
    };
    std::vector<Item> items;
    for (const LoadJob& job : jobs_) {
      const size_t n = job.dst->size();
      for (size_t first = 0; first < n; first += kChunk) items.push_back({&job, first, std::min(kChunk, n - first)});
    }
    parallel_for(items.size(), n_threads, [&](size_t i) {
      const Item& it = items[i];
      to_f32(it.job->src, it.first, it.count, it.job->dst->data() + it.first);
    });
  }

  size_t n_params() const { return n_params_; }

 private:
  const Checkpoint& ckpt_;
  std::vector<LoadJob> jobs_;
  size_t n_params_ = 0;
};

}  // namespace

Weights Weights::load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads) {
  const int64_t hidden = cfg.hidden_size, d = cfg.head_dim, inter = cfg.intermediate_size;
  const int64_t q_dim = int64_t(cfg.n_heads) * d, kv_dim = int64_t(cfg.n_kv_heads) * d;
  Weights w;
  LoadPlan plan(ckpt);
  plan.add("model.embed_tokens.weight", {cfg.vocab_size, hidden}, &w.embed);
  plan.add("model.norm.weight", {hidden}, &w.final_norm);
  if (!cfg.tie_embeddings) plan.add("lm_head.weight", {cfg.vocab_size, hidden}, &w.lm_head);
  w.layers.resize(size_t(cfg.n_layers));
  for (int i = 0; i < cfg.n_layers; ++i) {
    LayerWeights& l = w.layers[size_t(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    plan.add(p + "input_layernorm.weight", {hidden}, &l.attn_norm);
    plan.add(p + "self_attn.q_proj.weight", {q_dim, hidden}, &l.wq);
    plan.add(p + "self_attn.k_proj.weight", {kv_dim, hidden}, &l.wk);
    plan.add(p + "self_attn.v_proj.weight", {kv_dim, hidden}, &l.wv);
    if (cfg.qkv_bias) {
      plan.add(p + "self_attn.q_proj.bias", {q_dim}, &l.bq);
      plan.add(p + "self_attn.k_proj.bias", {kv_dim}, &l.bk);
      plan.add(p + "self_attn.v_proj.bias", {kv_dim}, &l.bv);
    }
    if (cfg.qk_norm) {
      plan.add(p + "self_attn.q_norm.weight", {d}, &l.q_norm);
      plan.add(p + "self_attn.k_norm.weight", {d}, &l.k_norm);
    }
    plan.add(p + "self_attn.o_proj.weight", {hidden, q_dim}, &l.wo);
    plan.add(p + "post_attention_layernorm.weight", {hidden}, &l.mlp_norm);
    plan.add(p + "mlp.gate_proj.weight", {inter, hidden}, &l.w_gate);
    plan.add(p + "mlp.up_proj.weight", {inter, hidden}, &l.w_up);
    plan.add(p + "mlp.down_proj.weight", {hidden, inter}, &l.w_down);
  }
  plan.run(n_threads);
  w.n_params = plan.n_params();
  return w;
}

}  // namespace kvq
