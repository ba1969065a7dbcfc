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

Model::Model(std::string dir, int n_threads, SimdLevel simd) : dir_(std::move(dir)), pool_(n_threads), simd_(simd) {}

std::unique_ptr<Model> Model::load(const std::string& dir, int n_threads, SimdLevel simd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model(dir, n_threads, simd));
  const Checkpoint ckpt = Checkpoint::open(dir);
  m->cfg_ = ModelConfig::load(ckpt.config_path());
  m->w_ = Weights::load(ckpt, m->cfg_, m->pool_.size());
  m->fingerprint_ = ckpt.fingerprint();
  m->build_linears();
  m->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

std::unique_ptr<Model> Model::dummy(const std::string& dir, const ModelConfig& cfg, uint64_t seed, int n_threads,
                                    SimdLevel simd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model(dir, n_threads, simd));
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
    linears_.push_back({Linear(lw.wq, lw.bq, simd_), Linear(lw.wk, lw.bk, simd_), Linear(lw.wv, lw.bv, simd_),
                        Linear(lw.wo, {}, simd_), Linear(lw.w_gate, {}, simd_), Linear(lw.w_up, {}, simd_),
                        Linear(lw.w_down, {}, simd_)});
    const LayerLinears& l = linears_.back();
    KVQ_CHECK(l.q.out() == qd && l.k.out() == kvd && l.v.out() == kvd && l.o.in() == qd && l.o.out() == H &&
                  l.gate.out() == c.intermediate_size && l.down.in() == c.intermediate_size,
              "model: layer {}'s weights do not have the config's shapes", linears_.size() - 1);
  }
  head_ = Linear(w_.output(), {}, simd_);
  openblas_set_num_threads(pool_.size());
}

const ValueFold* Model::fold_value_rotation(const std::shared_ptr<const KvTransform>& t) {
  if (!t || t->r_v.empty()) return nullptr;
  if (const ValueFold* f = value_fold(t.get())) return f;
  fold_linears_.clear();
  fold_ = kvq::fold_value_rotation(w_, cfg_, t, pool_);
  for (const ValueFold::Layer& fl : fold_->layers)
    fold_linears_.push_back({Linear(fl.wv, fl.bv, simd_), Linear(fl.wo, {}, simd_)});
  return fold_.get();
}

size_t Model::decode_weight_bytes() const {
  size_t bytes = head_.decode_bytes();
  for (const LayerLinears& l : linears_)
    for (const Linear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) bytes += x->decode_bytes();
  return bytes;
}

void Model::forward(KvCache& cache, int seq, const int32_t* ids, int n, float* logits, bool all_logits) {
  forward(cache, {Segment{seq, ids, n}}, logits, all_logits);
}

void Model::forward(KvCache& cache, const std::vector<Segment>& segments, float* logits, bool all_logits) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size;
  KVQ_CHECK(!segments.empty(), "forward: no sequences");
  KVQ_CHECK(cache.head_dim() == c.head_dim && cache.n_kv_heads() == c.n_kv_heads && cache.n_layers() == c.n_layers,
            "forward: the KV cache was made for another model shape");
  KVQ_CHECK(cache.config().attn_window == c.layer_window,
            "forward: the KV cache's sliding windows differ from the model's (sliding_window {}; CpuRunner fills them "
            "from the model)", c.sliding_window());
  KVQ_CHECK(!hook_ || segments.size() == 1, "forward: a layer hook observes a step of one sequence, not {}",
            segments.size());
  // Rows: the short sequences' first (decode rows, read together), then each longer chunk; spans[b] is segment b's.
  std::vector<Span>& spans = spans_;
  spans.clear();
  int rows = 0;
  for (const Segment& s : segments) {
    KVQ_CHECK(s.n > 0, "forward: no tokens for sequence {}", s.seq);
    for (const Span& o : spans) KVQ_CHECK(o.seq != s.seq, "forward: sequence {} appears twice in a step", s.seq);
    cache.reserve(s.seq, s.n);  // context overflow and chunk size are checked before any work
    spans.push_back({s.seq, cache.length(s.seq), 0, s.n});
  }
  for (bool small : {true, false})
    for (Span& s : spans)
      if ((s.n <= Linear::kGemvRows) == small) s.row0 = rows, rows += s.n;
  small_rows_ = 0;
  for (const Span& s : spans) small_rows_ += s.n <= Linear::kGemvRows ? s.n : 0;
  x_.resize(size_t(rows) * H);
  h_.resize(size_t(rows) * H);
  for (size_t b = 0; b < segments.size(); ++b)
    for (int i = 0; i < segments[b].n; ++i) {
      const int32_t id = segments[b].ids[i];
      KVQ_CHECK(id >= 0 && id < c.vocab_size, "token id {} is outside the vocabulary of {} tokens", id, c.vocab_size);
      w_.embed.to_f32(size_t(id) * H, size_t(H), x_.data() + size_t(spans[b].row0 + i) * H);
    }
  const int pos0 = spans[0].pos0;  // the hook's (one sequence)
  for (int l = 0; l < c.n_layers; ++l) {
    if (hook_) hook_->on_layer_input(l, pos0, rows, x_.data());
    attention_block(cache, spans, l, rows);
    mlp_block(l, rows);
    if (hook_) hook_->on_layer_output(l, pos0, rows, x_.data());
  }
  for (const Span& s : spans) cache.commit(s.seq, s.n);

  // The rows whose logits are asked for, in segment order: all, or each sequence's last. Each segment's go through
  // the output layer as its step alone would take them (decode rows together, row by row; a chunk's as one GEMM).
  std::vector<int> out_rows;
  for (const Span& s : spans)
    for (int i = all_logits ? 0 : s.n - 1; i < s.n; ++i) out_rows.push_back(s.row0 + i);
  const int n_out = int(out_rows.size());
  std::vector<float>& sel = gate_;  // scratch: the selected rows of the residual stream
  sel.resize(size_t(n_out) * H);
  for (int r = 0; r < n_out; ++r)
    std::copy_n(x_.data() + size_t(out_rows[size_t(r)]) * H, H, sel.data() + size_t(r) * H);
  rms_norm(sel.data(), n_out, H, w_.final_norm, c.rms_eps, h_.data());
  // Consecutive segments of at most Linear::kGemvRows tokens share the head's passes over its rows (a batched decode
  // step reads the head once, not once a sequence; each row's logits are the same bits either way).
  const auto out_rows_of = [&](size_t b) { return all_logits ? spans[b].n : 1; };
  const auto small = [&](size_t b) { return spans[b].n <= Linear::kGemvRows && head_.reads_rows(); };
  int r0 = 0;
  for (size_t b = 0; b < spans.size();) {
    int k = out_rows_of(b);
    size_t e = b + 1;
    if (small(b))
      for (; e < spans.size() && small(e); ++e) k += out_rows_of(e);
    float* y = logits + size_t(r0) * c.vocab_size;
    if (small(b))
      head_.apply_rows(h_.data() + size_t(r0) * H, k, y, pool_);
    else
      head_.apply(h_.data() + size_t(r0) * H, k, y, pool_);
    r0 += k;
    b = e;
  }
  for (int r = 0; r < n_out; ++r)
    for (int v = 0; v < c.vocab_size; ++v)
      if (!std::isfinite(logits[size_t(r) * c.vocab_size + v])) {
        const Span* s = &spans[0];
        for (const Span& x : spans)
          if (out_rows[size_t(r)] >= x.row0) s = &x;
        KVQ_FAIL("non-finite logits at position {} of sequence {} (numerical overflow in the model)",
                 s->pos0 + out_rows[size_t(r)] - s->row0, s->seq);
      }
}

void Model::attention_block(KvCache& cache, const std::vector<Span>& spans, int l, int n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerLinears& ll = linears_[size_t(l)];
  const int H = c.hidden_size, d = c.head_dim, hq = c.n_heads, hk = c.n_kv_heads;
  q_.resize(size_t(n) * hq * d);
  k_.resize(size_t(n) * hk * d);
  v_.resize(size_t(n) * hk * d);
  att_.resize(size_t(n) * hq * d);
  rms_norm(x_.data(), n, H, lw.attn_norm, c.rms_eps, h_.data());
  // With the cache's value rotation folded into W_V / W_O, the step reads those and applies the rest of the transform.
  const KvTransform* t = cache.config().transform.get();
  const ValueFold* fold = value_fold(t);
  const FoldedLinears* folded = fold ? &fold_linears_[size_t(l)] : nullptr;
  if (fold) t = fold->rest.get();
  KVQ_CHECK(!fold || !tap_, "model: a layer tap reads the values before the KV transform; not with a folded value "
            "rotation");
  linear(ll.q, h_.data(), q_.data());
  linear(ll.k, h_.data(), k_.data());
  linear(folded ? folded->v : ll.v, h_.data(), v_.data());
  if (c.qk_norm) {
    rms_norm(q_.data(), n * hq, d, lw.q_norm, c.rms_eps, q_.data());
    rms_norm(k_.data(), n * hk, d, lw.k_norm, c.rms_eps, k_.data());
  }
  const auto q_at = [&](const Span& s) { return q_.data() + size_t(s.row0) * hq * d; };
  const auto k_at = [&](const Span& s) { return k_.data() + size_t(s.row0) * hk * d; };
  const auto v_at = [&](const Span& s) { return v_.data() + size_t(s.row0) * hk * d; };
  for (const Span& s : spans) {
    rope_rows(q_at(s), s.n, hq, d, s.pos0, inv_freq_.data());
    rope_rows(k_at(s), s.n, hk, d, s.pos0, inv_freq_.data());
    if (tap_) tap_->on_qkv(l, s.pos0, s.n, q_at(s), k_at(s), v_at(s));
  }

  const float scale = 1.f / std::sqrt(float(d));
  for (float& x : q_) x *= scale;
  const TransformExec on_cpu{cache.config().simd, &pool_};
  if (t) t->inputs(l, n, k_.data(), v_.data(), hq, q_.data(), on_cpu);
  jobs_.clear();
  for (const Span& s : spans) {
    cache.observe_queries(s.seq, l, s.pos0, s.n, q_at(s), hq);  // the evict policy's observation window (else nothing)
    jobs_.push_back({s.seq, s.pos0, s.n, k_at(s), v_at(s), q_at(s), att_.data() + size_t(s.row0) * hq * d});
  }
  append_and_attend(cache, jobs_, l, AttentionShape{hq, hk, d}, pool_);
  if (t) t->outputs(l, n, hq, att_.data(), on_cpu);

  linear(folded ? folded->o : ll.o, att_.data(), h_.data());
  if (hook_) hook_->on_attention_output(l, spans[0].pos0, n, h_.data());
  for (size_t i = 0; i < size_t(n) * H; ++i) x_[i] += h_[i];
}

void Model::linear(const Linear& layer, const float* x, float* y) {
  const bool rows_together = layer.reads_rows();
  if (rows_together && small_rows_ > 0) layer.apply_rows(x, small_rows_, y, pool_);
  for (const Span& s : spans_)
    if (s.n > Linear::kGemvRows || !rows_together)
      layer.apply(x + size_t(s.row0) * layer.in(), s.n, y + size_t(s.row0) * layer.out(), pool_);
}

void Model::mlp_block(int l, int n) {
  const ModelConfig& c = cfg_;
  const LayerWeights& lw = w_.layers[size_t(l)];
  const LayerLinears& ll = linears_[size_t(l)];
  const int H = c.hidden_size, I = c.intermediate_size;
  gate_.resize(size_t(n) * I);
  up_.resize(size_t(n) * I);
  rms_norm(x_.data(), n, H, lw.mlp_norm, c.rms_eps, h_.data());
  linear(ll.gate, h_.data(), gate_.data());
  linear(ll.up, h_.data(), up_.data());
  for (size_t i = 0; i < size_t(n) * I; ++i) {
    const float g = gate_[i];
    gate_[i] = g / (1.f + std::exp(-g)) * up_[i];
  }
  linear(ll.down, gate_.data(), h_.data());
  for (size_t i = 0; i < size_t(n) * H; ++i) x_[i] += h_[i];
}

}  // namespace kvq
