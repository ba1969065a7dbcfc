#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/half.h"

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

// Checks the presence, dtype and shape of a tensor before any value is read.
TensorRef checked_ref(const Checkpoint& ckpt, const TensorSpec& spec) {
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
  return ref;
}

// Element conversions to fp32 (exact widening) of a run of raw elements.
void widen(DType dtype, const uint8_t* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, 4 * count);
      return;
    case DType::BF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_f32(h);
      }
      return;
    default: break;
  }
  KVQ_FAIL("weights: dtype {} does not widen to fp32", dtype_name(dtype));
}

constexpr size_t kChunk = size_t(1) << 20;  // elements a worker converts or generates at once

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

size_t model_matrix_bytes(const ModelConfig& cfg, size_t bytes_per_value) {
  size_t n = 0;
  for (const TensorSpec& s : model_tensors(cfg)) n += s.numel() * (s.matrix() ? bytes_per_value : sizeof(float));
  return n;
}

void WeightTensor::to_f32(size_t first, size_t count, float* dst) const {
  KVQ_CHECK(first <= numel() && count <= numel() - first, "weights: elements [{}, {}) of a tensor of {}", first,
            first + count, numel());
  if (count > 0) widen(dtype, data + first * dtype_size(dtype), count, dst);
}

std::vector<float> WeightTensor::to_f32() const {
  std::vector<float> out(numel());
  to_f32(0, numel(), out.data());
  return out;
}

void WeightTensor::release() const {
  if (file && !empty()) file->release_pages(data, nbytes());
}

WeightTensor& Weights::matrix_slot(TensorRole role, int layer) {
  using R = TensorRole;
  if (role == R::Embed) return embed;
  if (role == R::LmHead) return lm_head;
  KVQ_CHECK(layer >= 0 && size_t(layer) < layers.size(), "weights: layer {} of {}", layer, layers.size());
  LayerWeights& l = layers[size_t(layer)];
  switch (role) {
    case R::Wq: return l.wq;
    case R::Wk: return l.wk;
    case R::Wv: return l.wv;
    case R::Wo: return l.wo;
    case R::WGate: return l.w_gate;
    case R::WUp: return l.w_up;
    case R::WDown: return l.w_down;
    default: break;
  }
  KVQ_FAIL("weights: tensor role {} is not a matrix", int(role));
}

std::vector<float>& Weights::vector_slot(TensorRole role, int layer) {
  using R = TensorRole;
  if (role == R::FinalNorm) return final_norm;
  KVQ_CHECK(layer >= 0 && size_t(layer) < layers.size(), "weights: layer {} of {}", layer, layers.size());
  LayerWeights& l = layers[size_t(layer)];
  switch (role) {
    case R::AttnNorm: return l.attn_norm;
    case R::Bq: return l.bq;
    case R::Bk: return l.bk;
    case R::Bv: return l.bv;
    case R::QNorm: return l.q_norm;
    case R::KNorm: return l.k_norm;
    case R::MlpNorm: return l.mlp_norm;
    default: break;
  }
  KVQ_FAIL("weights: tensor role {} is not a vector", int(role));
}

const WeightTensor& Weights::matrix(TensorRole role, int layer) const {
  return const_cast<Weights*>(this)->matrix_slot(role, layer);
}

const std::vector<float>& Weights::vector(TensorRole role, int layer) const {
  return const_cast<Weights*>(this)->vector_slot(role, layer);
}

std::vector<float> Weights::values(TensorRole role, int layer) const {
  using R = TensorRole;
  switch (role) {
    case R::Embed: case R::LmHead: case R::Wq: case R::Wk: case R::Wv: case R::Wo: case R::WGate: case R::WUp:
    case R::WDown:
      return matrix(role, layer).to_f32();
    default:
      return vector(role, layer);
  }
}

size_t Weights::matrix_bytes() const {
  size_t n = embed.nbytes() + lm_head.nbytes();
  for (const LayerWeights& l : layers)
    for (const WeightTensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) n += t->nbytes();
  return n;
}

size_t Weights::owned_bytes() const { return owned_bytes_; }

Weights Weights::load(const Checkpoint& ckpt, const ModelConfig& cfg, int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  Weights w;
  w.layers.resize(size_t(cfg.n_layers));
  w.files_ = ckpt.shards();
  std::vector<std::pair<TensorRef, const TensorSpec*>> vectors;
  const std::vector<TensorSpec> table = model_tensors(cfg);
  std::vector<TensorRef> refs;
  for (const TensorSpec& spec : table) refs.push_back(checked_ref(ckpt, spec));  // every check before any read
  for (size_t i = 0; i < table.size(); ++i) {
    const TensorSpec& spec = table[i];
    const TensorRef& ref = refs[i];
    w.n_params += spec.numel();
    if (!spec.matrix()) {
      vectors.push_back({ref, &spec});
      continue;
    }
    WeightTensor& t = w.matrix_slot(spec.role, spec.layer);
    t.dtype = ref.info->dtype;
    t.rows = spec.shape[0], t.cols = spec.shape[1];
    t.data = ref.data;
    t.file = ref.file ? &ref.file->mapping() : nullptr;
    if (reinterpret_cast<uintptr_t>(ref.data) % dtype_size(t.dtype) != 0) {  // misaligned in the file: copied once
      w.owned_.emplace_back(new uint8_t[t.nbytes()]);
      std::memcpy(w.owned_.back().get(), ref.data, t.nbytes());
      w.owned_bytes_ += t.nbytes();
      t.data = w.owned_.back().get();
      t.file = nullptr;
    }
  }
  parallel_for(vectors.size(), n_threads, [&](size_t i) {
    const auto& [ref, spec] = vectors[i];
    std::vector<float>& v = w.vector_slot(spec->role, spec->layer);
    v.resize(spec->numel());
    widen(ref.info->dtype, ref.data, v.size(), v.data());
  });
  return w;
}

Weights Weights::dummy(const ModelConfig& cfg, uint64_t seed, int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  Weights w;
  w.layers.resize(size_t(cfg.n_layers));
  w.is_dummy = true;
  const float std = cfg.initializer_range;
  struct Item {
    const TensorSpec* spec;
    size_t first, count;  // element range of the tensor
  };
  const std::vector<TensorSpec> table = model_tensors(cfg);
  std::vector<Item> items;
  for (const TensorSpec& spec : table) {
    w.n_params += spec.numel();
    if (!spec.matrix()) {
      std::vector<float>& v = w.vector_slot(spec.role, spec.layer);
      v.resize(spec.numel());
      for (size_t i = 0; i < v.size(); ++i) v[i] = dummy_value(spec.init, std, seed, spec.stream(), i);
      continue;
    }
    WeightTensor& t = w.matrix_slot(spec.role, spec.layer);
    t.dtype = DType::BF16;
    t.rows = spec.shape[0], t.cols = spec.shape[1];
    w.owned_.emplace_back(new uint8_t[t.nbytes()]);  // not zeroed: the workers' writes are its first touch
    w.owned_bytes_ += t.nbytes();
    t.data = w.owned_.back().get();
    for (size_t first = 0; first < spec.numel(); first += kChunk)
      items.push_back({&spec, first, std::min(kChunk, spec.numel() - first)});
  }
  // The values are bf16 (dummy_value rounds them): their bits are stored as a bf16 checkpoint holds them.
  parallel_for(items.size(), n_threads, [&](size_t i) {
    const Item& it = items[i];
    const WeightTensor& t = w.matrix(it.spec->role, it.spec->layer);
    uint16_t* out = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(t.data)) + it.first;
    for (size_t j = 0; j < it.count; ++j)
      out[j] = f32_to_bf16(dummy_value(it.spec->init, std, seed, it.spec->stream(), it.first + j));
  });
  return w;
}

}  // namespace kvq
