#include "model/model.h"

#include <cblas.h>

#include <chrono>
#include <cmath>

#include "common/error.h"
#include "rotation/rope.h"

namespace kvq {

namespace {

// RMSNorm of n_rows rows of width dim: y = w * x / sqrt(mean(x^2) + eps), as Hugging Face computes it in fp32.
void rms_norm(const float* x, int n_rows, int dim, const std::vector<float>& w, float eps, float* y) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + size_t(r) * dim;
    float* yr = y + size_t(r) * dim;
    double ss = 0;
    for (int c = 0; c < dim; ++c) ss += double(xr[c]) * xr[c];
    const float inv = 1.f / std::sqrt(float(ss / dim) + eps);
    for (int c = 0; c < dim; ++c) yr[c] = w[size_t(c)] * (xr[c] * inv);
  }
}

}  // namespace

Model::Model(std::string dir, int n_threads) : dir_(std::move(dir)), pool_(n_threads) {}

std::unique_ptr<Model> Model::load(const std::string& dir, int n_threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model(dir, n_threads));
  const Checkpoint ckpt = Checkpoint::open(dir);
  m->cfg_ = ModelConfig::load(ckpt.config_path());
  m->w_ = Weights::load(ckpt, m->cfg_, m->pool_.size());
  m->fingerprint_ = ckpt.fingerprint();
  m->build_linears();
  m->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

std::unique_ptr<Model> Model::dummy(const std::string& dir, const ModelConfig& cfg, uint64_t seed, int n_threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model(dir, n_threads));
  m->cfg_ = cfg;
  m->w_ = Weights::dummy(cfg, seed, m->pool_.size());
  m->build_linears();
  m->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

void Model::build_linears() {
  inv_freq_ = cfg_.rope_inv_freq();
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  for (const LayerWeights& lw : w_.layers) {
    linears_.push_back({Linear(lw.wq, lw.bq), Linear(lw.wk, lw.bk), Linear(lw.wv, lw.bv), Linear(lw.wo),
                        Linear(lw.w_gate), Linear(lw.w_up), Linear(lw.w_down)});
    const LayerLinears& l = linears_.back();
    KVQ_CHECK(l.q.out() == qd && l.k.out() == kvd && l.v.out() == kvd && l.o.in() == qd && l.o.out() == H &&
                  l.gate.out() == c.intermediate_size && l.down.in() == c.intermediate_size,
              "model: layer {}'s weights do not have the config's shapes", linears_.size() - 1);
  }
  head_ = Linear(w_.output());
  openblas_set_num_threads(pool_.size());
}

size_t Model::decode_weight_bytes() const {
  size_t bytes = head_.decode_bytes();
  for (const LayerLinears& l : linears_)
    for (const Linear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) bytes += x->decode_bytes();
  return bytes;
}

void Model::forward(KvCache& cache, int seq, const int32_t* ids, int n, float* logits, bool all_logits) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, pos0 = cache.length(seq);
  KVQ_CHECK(n > 0, "forward: no tokens");
  KVQ_CHECK(cache.head_dim() == c.head_dim && cache.n_kv_heads() == c.n_kv_heads && cache.n_layers() == c.n_layers,
            "forward: the KV cache was made for another model shape");
  KVQ_CHECK(cache.config().attn_window == c.layer_window,
            "forward: the KV cache's sliding windows differ from the model's (sliding_window {}; CpuRunner fills them "
            "from the model)", c.sliding_window());
  cache.reserve(seq, n);  // context overflow and chunk size are checked before any work
  x_.resize(size_t(n) * H);
  h_.resize(size_t(n) * H);
  for (int i = 0; i < n; ++i) {
    KVQ_CHECK(ids[i] >= 0 && ids[i] < c.vocab_size, "token id {} is outside the vocabulary of {} tokens", ids[i],
              c.vocab_size);
    w_.embed.to_f32(size_t(ids[i]) * H, size_t(H), x_.data() + size_t(i) * H);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (hook_) hook_->on_layer_input(l, pos0, n, x_.data());
    attention_block(cache, seq, l, pos0, n);
    mlp_block(l, n);
    if (hook_) hook_->on_layer_output(l, pos0, n, x_.data());
  }
  cache.commit(seq, n);

  const int first = all_logits ? 0 : n - 1, rows = n - first;
  rms_norm(x_.data() + size_t(first) * H, rows, H, w_.final_norm, c.rms_eps, h_.data());
  head_.apply(h_.data(), rows, logits, pool_);
  for (size_t i = 0; i < size_t(rows) * c.vocab_size; ++i)
    KVQ_CHECK(std::isfinite(logits[i]), "non-finite logits at position {} (numerical overflow in the model)",
              pos0 + first + int(i / size_t(c.vocab_size)));
}

void Model::attention_block(KvCache& cache, int seq, int l, int pos0, int n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerLinears& ll = linears_[size_t(l)];
  const int H = c.hidden_size, d = c.head_dim, hq = c.n_heads, hk = c.n_kv_heads;
  q_.resize(size_t(n) * hq * d);
  k_.resize(size_t(n) * hk * d);
  v_.resize(size_t(n) * hk * d);
  att_.resize(size_t(n) * hq * d);
  rms_norm(x_.data(), n, H, lw.attn_norm, c.rms_eps, h_.data());
  ll.q.apply(h_.data(), n, q_.data(), pool_);
  ll.k.apply(h_.data(), n, k_.data(), pool_);
  ll.v.apply(h_.data(), n, v_.data(), pool_);
  if (c.qk_norm) {
    rms_norm(q_.data(), n * hq, d, lw.q_norm, c.rms_eps, q_.data());
    rms_norm(k_.data(), n * hk, d, lw.k_norm, c.rms_eps, k_.data());
  }
  rope_rows(q_.data(), n, hq, d, pos0, inv_freq_.data());
  rope_rows(k_.data(), n, hk, d, pos0, inv_freq_.data());
  if (tap_) tap_->on_qkv(l, pos0, n, q_.data(), k_.data(), v_.data());

  const float scale = 1.f / std::sqrt(float(d));
  for (float& x : q_) x *= scale;
  const KvTransform* t = cache.config().transform.get();
  if (t) {
    t->keys(l, n, k_.data());
    t->values(l, n, v_.data());
    t->queries(l, n, hq, q_.data());
  }
  cache.observe_queries(seq, l, pos0, n, q_.data(), hq);  // the evict policy's observation window (else nothing)
  cache.append(seq, l, pos0, n, k_.data(), v_.data());
  cache_attention(cache, seq, l, pos0, n, q_.data(), att_.data(), AttentionShape{hq, hk, d}, pool_);
  if (t) t->outputs(l, n, hq, att_.data());

  ll.o.apply(att_.data(), n, h_.data(), pool_);
  if (hook_) hook_->on_attention_output(l, pos0, n, h_.data());
  for (size_t i = 0; i < size_t(n) * H; ++i) x_[i] += h_[i];
}

void Model::mlp_block(int l, int n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerLinears& ll = linears_[size_t(l)];
  const int H = c.hidden_size, I = c.intermediate_size;
  gate_.resize(size_t(n) * I);
  up_.resize(size_t(n) * I);
  rms_norm(x_.data(), n, H, lw.mlp_norm, c.rms_eps, h_.data());
  ll.gate.apply(h_.data(), n, gate_.data(), pool_);
  ll.up.apply(h_.data(), n, up_.data(), pool_);
  for (size_t i = 0; i < size_t(n) * I; ++i) {
    const float g = gate_[i];
    gate_[i] = g / (1.f + std::exp(-g)) * up_[i];
  }
  ll.down.apply(gate_.data(), n, h_.data(), pool_);
  for (size_t i = 0; i < size_t(n) * H; ++i) x_[i] += h_[i];
}

}  // namespace kvq
