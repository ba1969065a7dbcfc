#include "kv/codec_rope.h"

#include <algorithm>
#include <utility>

#include "codecs/float_dot.h"
#include "codecs/fp8/fp8_scales.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "rotation/rope.h"

namespace kvq {

RopeKeyCodec::RopeKeyCodec(std::unique_ptr<KvCodec> inner, std::vector<float> inv_freq, int max_positions)
    : inner_(std::move(inner)), inv_freq_(std::move(inv_freq)) {
  KVQ_CHECK(inner_ && int(inv_freq_.size()) * 2 == inner_->head_dim(),
            "RopeKeyCodec: {} RoPE frequencies for head_dim {} (need head_dim / 2)", inv_freq_.size(),
            inner_ ? inner_->head_dim() : 0);
  const int d = inner_->head_dim(), half = d / 2, n = std::clamp(max_positions, 0, kMaxAngleTable);
  angles_.resize(size_t(n) * d);
  for (int pos = 0; pos < n; ++pos) {
    float* a = angles_.data() + size_t(pos) * d;
    rope_angles(pos, inv_freq_.data(), half, a, a + half);
  }
}

const float* RopeKeyCodec::angles(int pos, float* scratch) const {
  const int d = head_dim();
  if (pos >= 0 && size_t(pos + 1) * d <= angles_.size()) return angles_.data() + size_t(pos) * d;
  rope_angles(pos, inv_freq_.data(), d / 2, scratch, scratch + d / 2);
  return scratch;
}

void RopeKeyCodec::encode_at(const float* x, int pos0, uint8_t* block) const {
  const int d = head_dim(), n = tokens_per_block();
  thread_local std::vector<float> rows, scratch;
  rows.assign(x, x + size_t(n) * d);
  scratch.resize(size_t(d));
  for (int r = 0; r < n; ++r) {
    const float* a = angles(pos0 + r, scratch.data());
    rope_row(rows.data() + size_t(r) * d, d, a, a + d / 2, /*inverse=*/true);
  }
  inner_->encode(rows.data(), block);
}

void RopeKeyCodec::decode_at(const uint8_t* block, int pos0, float* x) const {
  const int d = head_dim();
  inner_->decode(block, x);
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(d));
  for (int r = 0; r < tokens_per_block(); ++r) {
    const float* a = angles(pos0 + r, scratch.data());
    rope_row(x + size_t(r) * d, d, a, a + d / 2);
  }
}

void RopeKeyCodec::scores_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name(), n_q, n_tokens);
  const int d = head_dim(), tpb = tokens_per_block();
  thread_local std::vector<float> keys, scratch;  // the piece's keys, decoded and re-rotated: [n_tokens, d]
  keys.resize(size_t(n_tokens) * d);
  scratch.resize(size_t(d));
  inner_->decode_rows(blocks, n_tokens / tpb, keys.data());
  for (int t = 0; t < n_tokens; ++t) {
    const float* a = angles(pos0 + t, scratch.data());
    rope_row(keys.data() + size_t(t) * d, d, a, a + d / 2);
  }
  for (int t = 0; t < n_tokens; ++t) {
    const float* k = keys.data() + size_t(t) * d;
    for (int i = 0; i < n_q; ++i) s[size_t(i) * n_tokens + t] = dot8(q + size_t(i) * d, k, d);
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

namespace {

// Whether spec takes the layer's scale of cfg.kv_scales: an FP8 row of the file's format at one of its layers (the cache
// refuses any other combination by name: kvq::cache_layout).
bool takes_tensor_scale(const CacheConfig& cfg, const CodecSpec& spec) {
  const Fp8Scales* s = cfg.kv_scales.get();
  if (!s || spec.layer < 0 || spec.layer >= s->n_layers()) return false;
  return codec_traits(spec.type).id == fp8::unscaled_row_of(s->format);
}

}  // namespace

std::unique_ptr<KvCodec> make_key_codec(const CacheConfig& cfg, int head_dim, int max_positions, int layer,
                                        int kv_head) {
  CodecSpec s = cfg.k;
  s.head_dim = head_dim;
  s.layer = layer, s.kv_head = kv_head;
  if (takes_tensor_scale(cfg, s)) s.tensor_scale = cfg.kv_scales->k_scale.at(size_t(layer));
  std::unique_ptr<KvCodec> codec = make_codec_at(s, cfg.simd);
  if (codec_traits(s.type).per_head) {
    const KvTransform* t = cfg.transform.get();
    KVQ_CHECK(!t || (t->key_mean.empty() && t->r_k.empty()),
              "KV cache: {} keys have widths per RoPE pair calibrated on the model's post-RoPE keys: the key side of "
              "the KV transform '{}' (--rotation, key centring) would mix or shift the pairs (use --rotation none)",
              s.type, t ? t->name : "none");
  }
  if (!codec_traits(s.type).pre_rope_keys) return codec;
  KVQ_CHECK(int(cfg.key_rope.size()) * 2 == head_dim,
            "KV cache: {} keys are stored without RoPE (docs/guide/methods.md §5.3), which needs the model's RoPE "
            "frequencies (head_dim / 2 = {}); this cache config has {} (the runner fills them from the model config)",
            s.type, head_dim / 2, cfg.key_rope.size());
  const KvTransform* t = cfg.transform.get();
  KVQ_CHECK(!t || (t->key_mean.empty() && t->r_k.empty()),
            "KV cache: {} keys are stored without RoPE and rotated by the codec's own Hadamard: the key side of the KV "
            "transform '{}' (--rotation, key centring) does not apply to them (use --rotation none)",
            s.type, t ? t->name : "none");
  return std::make_unique<RopeKeyCodec>(std::move(codec), cfg.key_rope, max_positions);
}

std::unique_ptr<KvCodec> make_value_codec(const CacheConfig& cfg, int head_dim, int layer) {
  CodecSpec s = cfg.v;
  s.head_dim = head_dim;
  s.layer = layer;
  if (takes_tensor_scale(cfg, s)) s.tensor_scale = cfg.kv_scales->v_scale.at(size_t(layer));
  return make_codec_at(s, cfg.simd);
}

}  // namespace kvq
