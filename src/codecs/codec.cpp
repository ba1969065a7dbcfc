#include "codecs/codec.h"

#include <cmath>
#include <vector>

#include "codecs/registry.h"
#include "common/error.h"
#include "rotation/hadamard.h"
#include "simd/simd.h"

namespace kvq {

void KvCodec::decode_rows(const uint8_t* blocks, int n_blocks, float* x) const {
  const size_t rows = size_t(tokens_per_block()) * size_t(head_dim());
  for (int b = 0; b < n_blocks; ++b) decode(blocks + size_t(b) * bytes_per_block(), x + size_t(b) * rows);
}

void KvCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  scores_ref(q, n_q, blocks, n_tokens, s);
}

void KvCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  accumulate_ref(p, n_q, blocks, n_tokens, acc);
}

void KvCodec::scores_ref(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(!positional(), "{}: a positional codec scores through scores_ref_at (rows need their positions)", name());
  scores_ref_at(q, n_q, blocks, 0, n_tokens, s);
}

void KvCodec::scores_ref_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const {
  const int d = head_dim(), tpb = tokens_per_block();
  std::vector<float> rows(size_t(tpb) * d);
  for (int t0 = 0; t0 < n_tokens; t0 += tpb) {
    decode_at(blocks + size_t(t0 / tpb) * bytes_per_block(), pos0 + t0, rows.data());
    for (int r = 0; r < tpb; ++r)
      for (int i = 0; i < n_q; ++i) {
        float dot = 0.f;
        for (int c = 0; c < d; ++c) dot += q[size_t(i) * d + c] * rows[size_t(r) * d + c];
        s[size_t(i) * n_tokens + t0 + r] = dot;
      }
  }
}

void KvCodec::accumulate_ref(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  const int d = head_dim(), tpb = tokens_per_block();
  std::vector<float> rows(size_t(tpb) * d);
  for (int t0 = 0; t0 < n_tokens; t0 += tpb) {
    decode(blocks + size_t(t0 / tpb) * bytes_per_block(), rows.data());
    for (int r = 0; r < tpb; ++r)
      for (int i = 0; i < n_q; ++i) {
        const float w = p[size_t(i) * n_tokens + t0 + r];
        for (int c = 0; c < d; ++c) acc[size_t(i) * d + c] += w * rows[size_t(r) * d + c];
      }
  }
}

namespace {

std::string per_channel_names() { return codec_names_if([](const CodecTraits& t) { return t.per_channel_keys; }); }

// "f32, bf16; int8, int4, int2 (per token, ...); kivi2, kivi4 (...); oscar_int2, kitty_int2, tq2, ... (...)": the
// table's rows by kind (unquantized, grouped per token, grouped per-channel keys, formats with their own groups or
// blocks), then the shapes.
std::string supported_list() {
  return fmt::format(
      "supported: {}; {} (per token, group 32, 64 or 128 dividing head_dim); {} (per_channel keys: group = 32, 64 or "
      "128 tokens; values: per-token rows, group 32, 64 or 128 dividing head_dim); {} (their own groups or blocks; "
      "{}: head_dim a power of two); head_dim a multiple of 32 up to {} ({}: of 16); clip in (0, 1]",
      codec_names_if([](const CodecTraits& t) { return !t.grouped && !fixed_format(t); }),
      codec_names_if([](const CodecTraits& t) { return t.grouped && !t.per_channel_keys; }),
      codec_names_if([](const CodecTraits& t) { return t.grouped && t.per_channel_keys; }),
      codec_names_if([](const CodecTraits& t) { return fixed_format(t); }),
      codec_names_if([](const CodecTraits& t) { return t.pow2_head_dim; }), kCpuMaxHeadDim,
      codec_names_if([](const CodecTraits& t) { return t.head_dim_unit == 16; }));
}

bool valid_group(int g) {
  for (int x : kGroups)
    if (g == x) return true;
  return false;
}

}  // namespace

std::unique_ptr<KvCodec> make_codec_at(const CodecSpec& spec, SimdLevel level) {
  const std::string combo = fmt::format("type '{}' × head_dim {} × group {}{}", spec.type, spec.head_dim, spec.group,
                                        spec.per_channel ? " (per_channel)" : "");
  const CodecTraits* t = find_codec(spec.type);
  KVQ_CHECK(t, "KV cache {} is not supported: unknown type ({})", combo, supported_list());
  KVQ_CHECK(spec.head_dim > 0 && spec.head_dim % t->head_dim_unit == 0 && spec.head_dim <= kCpuMaxHeadDim,
            "KV cache {} is not supported: {} needs head_dim a multiple of {} up to {} ({})", combo, t->name,
            t->head_dim_unit, kCpuMaxHeadDim, supported_list());
  KVQ_CHECK(!t->pow2_head_dim || is_power_of_two(spec.head_dim),
            "KV cache {} is not supported: {} needs a power-of-two head_dim for its Hadamard ({})", combo, t->name,
            supported_list());
  KVQ_CHECK(!spec.per_channel || t->per_channel_keys,
            "KV cache {} is not supported: per_channel is only for {} keys ({})", combo, per_channel_names(),
            supported_list());
  KVQ_CHECK(spec.tensor_scale == 1.f || t->id == CodecId::kFp8e4m3 || t->id == CodecId::kFp8e5m2,
            "KV cache {} is not supported: a per-tensor scale is for vLLM's fp8 / fp8_e5m2 caches only", combo);
  KVQ_CHECK(std::isfinite(spec.tensor_scale) && spec.tensor_scale > 0.f,
            "KV cache {} is not supported: per-tensor scale {} (finite and > 0)", combo, spec.tensor_scale);
  if (!t->grouped) return t->make(spec, level);
  KVQ_CHECK(valid_group(spec.group), "KV cache {} is not supported: group must be 32, 64 or 128 ({})", combo,
            supported_list());
  KVQ_CHECK(std::isfinite(spec.clip) && spec.clip > 0.f && spec.clip <= 1.f,
            "KV cache {} is not supported: clip {} must be in (0, 1] ({})", combo, spec.clip, supported_list());
  KVQ_CHECK(spec.per_channel || spec.head_dim % spec.group == 0,
            "KV cache {} is not supported: group must divide head_dim for per-token rows ({})", combo,
            supported_list());
  return t->make(spec, level);
}

std::unique_ptr<KvCodec> make_codec(const CodecSpec& spec) { return make_codec_at(spec, best_simd_level()); }

}  // namespace kvq
