#include "kv/codec_rope.h"

#include <utility>

#include "common/error.h"
#include "kv/codec_registry.h"
#include "rotation/rope.h"

namespace kvq {

RopeKeyCodec::RopeKeyCodec(std::unique_ptr<KvCodec> inner, std::vector<float> inv_freq)
    : inner_(std::move(inner)), inv_freq_(std::move(inv_freq)) {
  KVQ_CHECK(inner_ && int(inv_freq_.size()) * 2 == inner_->head_dim(),
            "RopeKeyCodec: {} RoPE frequencies for head_dim {} (need head_dim / 2)", inv_freq_.size(),
            inner_ ? inner_->head_dim() : 0);
}

void RopeKeyCodec::encode_at(const float* x, int pos0, uint8_t* block) const {
  const int d = head_dim(), n = tokens_per_block();
  thread_local std::vector<float> rows;
  rows.assign(x, x + size_t(n) * d);
  rope_rows(rows.data(), n, 1, d, pos0, inv_freq_.data(), /*inverse=*/true);
  inner_->encode(rows.data(), block);
}

void RopeKeyCodec::decode_at(const uint8_t* block, int pos0, float* x) const {
  inner_->decode(block, x);
  rope_rows(x, tokens_per_block(), 1, head_dim(), pos0, inv_freq_.data());
}

void RopeKeyCodec::scores_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name(), n_q, n_tokens);
  const int d = head_dim(), tpb = tokens_per_block();
  thread_local std::vector<float> keys;  // the piece's keys, decoded and re-rotated: [n_tokens, d]
  keys.resize(size_t(n_tokens) * d);
  for (int t0 = 0; t0 < n_tokens; t0 += tpb)
    inner_->decode(blocks + size_t(t0 / tpb) * bytes_per_block(), keys.data() + size_t(t0) * d);
  rope_rows(keys.data(), n_tokens, 1, d, pos0, inv_freq_.data());
  for (int i = 0; i < n_q; ++i) {
    const float* qi = q + size_t(i) * d;
    for (int t = 0; t < n_tokens; ++t) {
      const float* k = keys.data() + size_t(t) * d;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += qi[c] * k[c];
      s[size_t(i) * n_tokens + t] = dot;
    }
  }
}

void RopeKeyCodec::encode(const float*, uint8_t*) const {
  KVQ_FAIL("{} keys are stored without RoPE: encoding needs the row's position (encode_at)", name());
}
void RopeKeyCodec::decode(const uint8_t*, float*) const {
  KVQ_FAIL("{} keys are stored without RoPE: decoding needs the row's position (decode_at)", name());
}
void RopeKeyCodec::scores(const float*, int, const uint8_t*, int, float*) const {
  KVQ_FAIL("{} keys are stored without RoPE: scoring needs the rows' positions (scores_at)", name());
}
void RopeKeyCodec::accumulate(const float*, int, const uint8_t*, int, float*) const {
  KVQ_FAIL("{}: a key codec without RoPE stores keys, not values (accumulate)", name());
}

std::unique_ptr<KvCodec> make_key_codec(const CacheConfig& cfg, int head_dim) {
  CodecSpec s = cfg.k;
  s.head_dim = head_dim;
  std::unique_ptr<KvCodec> codec = make_codec(s);
  if (!codec_traits(s.type).pre_rope_keys) return codec;
  KVQ_CHECK(int(cfg.key_rope.size()) * 2 == head_dim,
            "KV cache: {} keys are stored without RoPE (docs/METHODS.md §5.3), which needs the model's RoPE "
            "frequencies (head_dim / 2 = {}); this cache config has {} (the runner fills them from the model config)",
            s.type, head_dim / 2, cfg.key_rope.size());
  const KvTransform* t = cfg.transform.get();
  KVQ_CHECK(!t || (t->key_mean.empty() && t->r_k.empty()),
            "KV cache: {} keys are stored without RoPE and rotated by the codec's own Hadamard: the key side of the KV "
            "transform '{}' (--rotation, key centring) does not apply to them (use --rotation none)",
            s.type, t ? t->name : "none");
  return std::make_unique<RopeKeyCodec>(std::move(codec), cfg.key_rope);
}

}  // namespace kvq
