#include "kv/cache.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/error.h"

namespace kvq {

struct KvCache::Sequence {
  bool live = false;
  int n_tokens = 0;                // committed positions
  std::vector<int> pages;          // block table: page ids of quantized positions, in order
  std::vector<uint8_t> sinks;      // [n_layers][2][n_kv][S0] window rows
  std::vector<uint8_t> ring;       // [n_layers][2][n_kv][ring_tokens] window rows
};

std::string CacheConfig::describe() const {
  auto one = [](const CodecSpec& c) {
    if (c.type == "bf16" || c.type == "f32") return c.type;
    return fmt::format("{}/g{}/r{:g}", c.type, c.group, c.clip);
  };
  return fmt::format("k={} v={} sink={} recent={} window={} rotation={}", one(k), one(v), sink, recent, window,
                     rotation());
}

KvCache::KvCache(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx, int max_seqs)
    : cfg_(cfg), n_layers_(n_layers), n_kv_(n_kv_heads), d_(head_dim), max_ctx_(max_ctx), max_seqs_(max_seqs) {
  KVQ_CHECK(cfg.sink >= 0 && cfg.recent >= 0, "KV cache: --kv-sink {} / --kv-recent {} must be >= 0", cfg.sink,
            cfg.recent);
  KVQ_CHECK(cfg.max_chunk > 0 && max_ctx > 0 && max_seqs > 0, "KV cache: bad sizes (chunk {}, ctx {}, seqs {})",
            cfg.max_chunk, max_ctx, max_seqs);
  if (const KvTransform* t = cfg.transform.get(); t && !t->identity())
    KVQ_CHECK(t->n_layers == n_layers && t->n_kv_heads == n_kv_heads && t->head_dim == head_dim,
              "KV cache: transform '{}' of (layers {}, kv heads {}, d {}) does not fit the cache ({}, {}, {})", t->name,
              t->n_layers, t->n_kv_heads, t->head_dim, n_layers, n_kv_heads, head_dim);
  CodecSpec ks = cfg.k, vs = cfg.v;
  ks.head_dim = vs.head_dim = head_dim;
  k_codec_ = make_codec(ks);
  v_codec_ = make_codec(vs);
  window_ = make_codec(CodecSpec{.type = cfg.window, .head_dim = head_dim});
  KVQ_CHECK(window_->tokens_per_block() == 1, "KV cache: window type '{}' is not a per-token codec", cfg.window);
  window_row_ = window_->bytes_per_block();
  block_tokens_ = std::lcm(k_codec_->tokens_per_block(), v_codec_->tokens_per_block());
  KVQ_CHECK(cfg.page_tokens > 0 && cfg.page_tokens % block_tokens_ == 0,
            "KV cache: page size {} is not a multiple of the codec block of {} tokens ({} keys, {} values)",
            cfg.page_tokens, block_tokens_, k_codec_->name(), v_codec_->name());
  ring_tokens_ = cfg.recent + block_tokens_ + cfg.max_chunk;
  const int P = cfg.page_tokens;
  k_region_ = size_t(P / k_codec_->tokens_per_block()) * k_codec_->bytes_per_block();
  v_region_ = size_t(P / v_codec_->tokens_per_block()) * v_codec_->bytes_per_block();
  head_bytes_ = k_region_ + v_region_;
  page_bytes_ = head_bytes_ * size_t(n_layers) * size_t(n_kv_heads);
  const int quant_tokens = std::max(0, max_ctx - cfg.sink);
  pages_per_seq_ = (quant_tokens + P - 1) / P;
  const size_t n_pages = size_t(pages_per_seq_) * size_t(max_seqs);
  pool_.reset(new uint8_t[std::max<size_t>(1, n_pages * page_bytes_)]);
  free_pages_.resize(n_pages);
  for (size_t i = 0; i < n_pages; ++i) free_pages_[i] = int(n_pages - 1 - i);
  seqs_.resize(size_t(max_seqs));
  for (auto& s : seqs_) s = std::make_unique<Sequence>();
}

KvCache::~KvCache() = default;

int KvCache::new_sequence() {
  for (int i = 0; i < max_seqs_; ++i) {
    Sequence& s = *seqs_[size_t(i)];
    if (s.live) continue;
    s.live = true;
    s.n_tokens = 0;
    s.pages.clear();
    s.sinks.assign(size_t(n_layers_) * 2 * n_kv_ * size_t(cfg_.sink) * window_row_, 0);
    s.ring.assign(size_t(n_layers_) * 2 * n_kv_ * size_t(ring_tokens_) * window_row_, 0);
    return i;
  }
  KVQ_FAIL("KV cache: all {} sequence slots are in use", max_seqs_);
}

void KvCache::free_sequence(int seq) {
  Sequence& s = *seqs_.at(size_t(seq));
  free_pages_.insert(free_pages_.end(), s.pages.rbegin(), s.pages.rend());
  s = Sequence{};
}

int KvCache::length(int seq) const { return seqs_.at(size_t(seq))->n_tokens; }

int KvCache::quant_end(int t) const {
  const int S0 = cfg_.sink;
  const int span = std::max(0, t + 1 - cfg_.recent - S0);
  return S0 + span / block_tokens_ * block_tokens_;
}

void KvCache::reserve(int seq, int n_new) {
  Sequence& s = *seqs_.at(size_t(seq));
  KVQ_CHECK(s.live, "KV cache: sequence {} is not live", seq);
  KVQ_CHECK(n_new <= cfg_.max_chunk, "KV cache: chunk of {} tokens exceeds the ring's chunk size {}", n_new,
            cfg_.max_chunk);
  const int end = s.n_tokens + n_new;
  KVQ_CHECK(end <= max_ctx_, "context overflow: {} tokens exceed the cache's context of {} tokens", end, max_ctx_);
  const int quant_tokens = quant_end(end - 1) - cfg_.sink;
  const int need = (quant_tokens + cfg_.page_tokens - 1) / cfg_.page_tokens;
  while (int(s.pages.size()) < need) {
    KVQ_CHECK(!free_pages_.empty(), "KV cache: page pool exhausted ({} pages)", pages_per_seq_ * max_seqs_);
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
}

uint8_t* KvCache::sink_row(Sequence& s, int layer, int kv, int head, int pos) const {
  return s.sinks.data() + (((size_t(layer) * 2 + kv) * n_kv_ + head) * cfg_.sink + pos) * window_row_;
}

uint8_t* KvCache::ring_row(Sequence& s, int layer, int kv, int head, int pos) const {
  return s.ring.data() + (((size_t(layer) * 2 + kv) * n_kv_ + head) * ring_tokens_ + pos % ring_tokens_) * window_row_;
}

void KvCache::append(int seq, int layer, int pos0, int n, const float* k, const float* v) {
  Sequence& s = *seqs_.at(size_t(seq));
  KVQ_CHECK(s.live && pos0 == s.n_tokens, "KV cache: append at {} but sequence {} holds {} tokens", pos0, seq,
            s.n_tokens);
  for (int i = 0; i < n; ++i) {
    const int pos = pos0 + i;
    for (int h = 0; h < n_kv_; ++h) {
      const float* rows[2] = {k + (size_t(i) * n_kv_ + h) * d_, v + (size_t(i) * n_kv_ + h) * d_};
      for (int kv = 0; kv < 2; ++kv)
        window_->encode(rows[kv], pos < cfg_.sink ? sink_row(s, layer, kv, h, pos) : ring_row(s, layer, kv, h, pos));
    }
  }
  demote(s, layer, quant_end(pos0 - 1), quant_end(pos0 + n - 1));
}

void KvCache::demote(Sequence& s, int layer, int from, int to) {
  // Quantize blocks [from, to) of every head from the ring into their pages.
  const int S0 = cfg_.sink, P = cfg_.page_tokens;
  from = std::max(from, S0);
  std::vector<float> rows(size_t(block_tokens_) * d_);
  for (int b0 = from; b0 < to; b0 += block_tokens_) {
    const int q = b0 - S0;
    KVQ_CHECK(q / P < int(s.pages.size()), "KV cache: demotion past the reserved pages (reserve() not called)");
    uint8_t* page = page_ptr(s.pages[size_t(q / P)]);
    for (int h = 0; h < n_kv_; ++h) {
      uint8_t* head = page + head_offset(layer, h);
      for (int kv = 0; kv < 2; ++kv) {
        const KvCodec& codec = kv ? *v_codec_ : *k_codec_;
        const int tpb = codec.tokens_per_block();
        uint8_t* region = head + (kv ? k_region_ : 0);
        for (int t0 = b0; t0 < b0 + block_tokens_; t0 += tpb) {
          for (int r = 0; r < tpb; ++r) window_->decode(ring_row(s, layer, kv, h, t0 + r), rows.data() + size_t(r) * d_);
          codec.encode(rows.data(), region + size_t((t0 - S0) % P / tpb) * codec.bytes_per_block());
        }
      }
    }
  }
}

void KvCache::commit(int seq, int n) { seqs_.at(size_t(seq))->n_tokens += n; }

void KvCache::runs(int seq, int layer, int kv_head, int t_first, int t_last, std::vector<Run>& out) const {
  Sequence& s = *seqs_.at(size_t(seq));
  const int S0 = cfg_.sink, P = cfg_.page_tokens;
  out.clear();
  const int n_sink = std::min(S0, t_last + 1);
  if (n_sink > 0)
    out.push_back({RunKind::Sink, 0, n_sink,
                   sink_row(s, layer, 0, kv_head, 0), sink_row(s, layer, 1, kv_head, 0)});
  const int q_end = quant_end(t_last);
  for (int p0 = S0; p0 < q_end; p0 += P) {
    const uint8_t* head = page_ptr(s.pages[size_t((p0 - S0) / P)]) + head_offset(layer, kv_head);
    out.push_back({RunKind::Quant, p0, std::min(P, q_end - p0), head, head + k_region_});
  }
  // Recent rows: everything from the first query's window start to the last query, split at the ring's wrap.
  for (int p0 = std::max(S0, quant_end(t_first)); p0 <= t_last;) {
    const int slot = p0 % ring_tokens_;
    const int n = std::min(t_last + 1 - p0, ring_tokens_ - slot);
    out.push_back({RunKind::Recent, p0, n, ring_row(s, layer, 0, kv_head, p0), ring_row(s, layer, 1, kv_head, p0)});
    p0 += n;
  }
}

CacheFootprint KvCache::footprint(int n) const {
  // Per (token, layer): K and V rows of every kv head. Sinks and the W most recent tokens are window rows, the
  // rest is stored by the codecs; residual tokens of a partly filled KIVI block are counted as window rows.
  const double elems = 2.0 * n_kv_ * d_;  // K + V elements per token per layer
  const double window_bytes = 2.0 * n_kv_ * double(window_row_);
  const double quant_bytes = n_kv_ * (double(k_codec_->bytes_per_block()) / k_codec_->tokens_per_block() +
                                      double(v_codec_->bytes_per_block()) / v_codec_->tokens_per_block());
  const int n_window = std::min(n, n - (quant_end(n - 1) - cfg_.sink));
  const int n_quant = n - n_window;
  const double total = n_window * window_bytes + n_quant * quant_bytes;
  CacheFootprint f;
  f.bytes_per_token_per_layer = total / n;
  f.bits_per_element = 8.0 * total / (double(n) * elems);
  f.quant_bits_per_element = 8.0 * quant_bytes / elems;
  return f;
}

size_t KvCache::bytes_allocated() const {
  size_t per_seq = size_t(n_layers_) * 2 * n_kv_ * size_t(cfg_.sink + ring_tokens_) * window_row_;
  return size_t(pages_per_seq_) * max_seqs_ * page_bytes_ + per_seq * max_seqs_;
}

int KvCache::token_capacity() const { return max_ctx_ * max_seqs_; }

}  // namespace kvq
