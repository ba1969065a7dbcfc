#include "attention/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "codecs/oscar/oscar_format.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "kv/codec_rope.h"

namespace kvq {

ReferenceKv::ReferenceKv(const CacheConfig& cfg, int n_kv_heads, int head_dim)
    : cfg_(cfg), n_kv_(n_kv_heads), d_(head_dim) {
  k_codec_ = make_key_codec(cfg, head_dim);
  v_codec_ = make_value_codec(cfg, head_dim);
  window_ = make_codec(window_spec(cfg, head_dim));
  // B: the demotion block when set (a multiple of the codecs' block: KvCache checks), else the codecs' block
  const int codec_block = std::lcm(k_codec_->tokens_per_block(), v_codec_->tokens_per_block());
  block_ = cfg.demote_block > 0 ? cfg.demote_block : codec_block;
  if (codec_traits(cfg.k.type).per_head)  // PN-Mix keys: each head its own widths (layer 0: one layer is modelled)
    for (int h = 0; h < n_kv_heads; ++h) head_k_codecs_.push_back(make_key_codec(cfg, head_dim, 0, 0, h));
}

ReferenceKv::~ReferenceKv() = default;

void ReferenceKv::append(int n, const float* k, const float* v) {
  const size_t row = size_t(n_kv_) * d_, first = size_t(n_tokens_) * row;
  n_tokens_ += n;
  for (auto* buf : {&wk_, &wv_, &sk_, &sv_, &qk_, &qv_}) buf->resize(size_t(n_tokens_) * row);
  std::vector<uint8_t> block(std::max(window_->bytes_per_block(),
                                      std::max(k_codec_->bytes_per_block(), v_codec_->bytes_per_block())));
  const bool from_bf16 = window_quantized(cfg_);  // an int8 window row is not re-quantized
  for (size_t i = 0; i < size_t(n) * n_kv_; ++i) {  // window round trips, and what demotion quantizes
    window_->encode(k + i * d_, block.data());
    window_->decode(block.data(), wk_.data() + first + i * d_);
    window_->encode(v + i * d_, block.data());
    window_->decode(block.data(), wv_.data() + first + i * d_);
    for (int c = 0; c < d_; ++c) {
      const size_t at = first + i * d_ + size_t(c);
      sk_[at] = from_bf16 ? bf16_to_f32(f32_to_bf16(k[i * d_ + c])) : wk_[at];
      sv_[at] = from_bf16 ? bf16_to_f32(f32_to_bf16(v[i * d_ + c])) : wv_[at];
    }
  }
  // Quantized twins of every whole block after the sinks: the codec round trip of the window rows of the block.
  const int S0 = cfg_.sink;
  std::vector<float> in(size_t(block_) * d_), out(in.size()), nu(size_t(block_), 1.f);
  while (S0 + n_quantized_ + block_ <= n_tokens_) {
    const int b0 = S0 + n_quantized_;
    if (cfg_.k.token_scale)  // ν of each position: the norm of its window key rows over all kv heads
      for (int i = 0; i < block_; ++i) {
        float sum = 0.f;
        for (int h = 0; h < n_kv_; ++h) {
          const float* row = sk_.data() + (size_t(b0 + i) * n_kv_ + h) * d_;
          sum = exact::add(sum, token_sum_squares([&](int c) { return row[c]; }, d_));
        }
        nu[size_t(i)] = token_scale(sum);
      }
    const bool scaled = cfg_.k.token_scale;
    for (int h = 0; h < n_kv_; ++h)
      for (int kv = 0; kv < 2; ++kv) {
        const KvCodec& codec = kv ? *v_codec_ : head_k_codecs_.empty() ? *k_codec_ : *head_k_codecs_[size_t(h)];
        const std::vector<float>& src = kv ? sv_ : sk_;
        std::vector<float>& dst = kv ? qv_ : qk_;
        const int tpb = codec.tokens_per_block();
        for (int t0 = b0; t0 < b0 + block_; t0 += tpb) {
          for (int r = 0; r < tpb; ++r)
            for (int c = 0; c < d_; ++c) {
              const float x = src[(size_t(t0 + r) * n_kv_ + h) * d_ + c];
              in[size_t(r) * d_ + c] = kv == 0 && scaled ? x / nu[size_t(t0 + r - b0)] : x;
            }
          codec.encode_at(in.data(), t0, block.data());
          codec.decode_at(block.data(), t0, out.data());
          for (int r = 0; r < tpb; ++r)
            for (int c = 0; c < d_; ++c) {
              const float x = out[size_t(r) * d_ + c];
              dst[(size_t(t0 + r) * n_kv_ + h) * d_ + c] = kv == 0 && scaled ? x * nu[size_t(t0 + r - b0)] : x;
            }
        }
      }
    n_quantized_ += block_;
  }
}

int ReferenceKv::quant_end(int t) const {
  // The window holds the W most recent positions [t - W + 1, t]; a block leaves it when its last token does.
  int qe = cfg_.sink;
  while (qe + block_ - 1 <= t - cfg_.recent) qe += block_;
  return qe;
}

const float* ReferenceKv::row(const std::vector<float>& window, const std::vector<float>& quant, int t, int pos,
                              int h) const {
  KVQ_CHECK(pos >= 0 && pos <= t && t < n_tokens_, "ReferenceKv: position {} for a query at {} of {} tokens", pos, t,
            n_tokens_);
  const bool quantized = pos >= cfg_.sink && pos < quant_end(t);
  return (quantized ? quant : window).data() + (size_t(pos) * n_kv_ + h) * d_;
}

const float* ReferenceKv::key(int t, int pos, int h) const { return row(wk_, qk_, t, pos, h); }
const float* ReferenceKv::value(int t, int pos, int h) const { return row(wv_, qv_, t, pos, h); }

void ReferenceKv::attend(int t, const float* q, int n_heads, double* out) const {
  const int g = n_heads / n_kv_;
  const int w = cfg_.attn_window_of(0), first = w > 0 ? std::max(0, t - w + 1) : 0;  // a sliding window: (t - w, t]
  std::vector<double> s(size_t(t) + 1, 0.0);
  for (int j = 0; j < n_heads; ++j) {
    const int h = j / g;
    double mx = -INFINITY;
    for (int pos = first; pos <= t; ++pos) {
      const float* k = key(t, pos, h);
      double dot = 0;
      for (int c = 0; c < d_; ++c) dot += double(q[size_t(j) * d_ + c]) * k[c];
      s[size_t(pos)] = dot;
      mx = std::max(mx, dot);
    }
    double sum = 0;
    for (int pos = first; pos <= t; ++pos) sum += (s[size_t(pos)] = std::exp(s[size_t(pos)] - mx));
    double* o = out + size_t(j) * d_;
    std::fill(o, o + d_, 0.0);
    for (int pos = first; pos <= t; ++pos) {
      const float* v = value(t, pos, h);
      for (int c = 0; c < d_; ++c) o[c] += s[size_t(pos)] / sum * v[c];
    }
  }
}

}  // namespace kvq
