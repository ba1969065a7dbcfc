#include "kv/codec.h"

#include <cmath>
#include <vector>

#include "common/error.h"
#include "kv/codec_bf16.h"
#include "kv/codec_f32.h"
#include "kv/codec_int.h"
#include "kv/codec_kivi.h"
#include "kv/simd.h"

namespace kvq {

void KvCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  scores_ref(q, n_q, blocks, n_tokens, s);
}

void KvCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  accumulate_ref(p, n_q, blocks, n_tokens, acc);
}

void KvCodec::scores_ref(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  const int d = head_dim(), tpb = tokens_per_block();
  std::vector<float> rows(size_t(tpb) * d);
  for (int t0 = 0; t0 < n_tokens; t0 += tpb) {
    decode(blocks + size_t(t0 / tpb) * bytes_per_block(), rows.data());
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

constexpr const char* kSupported =
    "supported: f32, bf16; int8, int4, int2 (per token, group 32, 64 or 128 dividing head_dim); kivi2, kivi4 "
    "(per_channel keys: group = 32, 64 or 128 tokens; values: per-token rows, group 32, 64 or 128 dividing "
    "head_dim); head_dim a multiple of 32 up to 256; clip in (0, 1]";

int type_bits(const std::string& type) {
  if (type == "int8") return 8;
  if (type == "int4" || type == "kivi4") return 4;
  if (type == "int2" || type == "kivi2") return 2;
  return 0;
}

}  // namespace

std::unique_ptr<KvCodec> make_codec_at(const CodecSpec& spec, SimdLevel level) {
  const std::string combo = fmt::format("type '{}' × head_dim {} × group {}{}", spec.type, spec.head_dim, spec.group,
                                        spec.per_channel ? " (per_channel)" : "");
  KVQ_CHECK(spec.head_dim > 0 && spec.head_dim % 32 == 0 && spec.head_dim <= 256,
            "KV cache {} is not supported: head_dim must be a multiple of 32 up to 256 ({})", combo, kSupported);
  const bool kivi = spec.type == "kivi2" || spec.type == "kivi4";
  if (spec.type == "f32") {
    KVQ_CHECK(!spec.per_channel, "KV cache {} is not supported: per_channel is only for kivi2/kivi4 keys ({})", combo,
              kSupported);
    return std::make_unique<F32Codec>(spec.head_dim);
  }
  if (spec.type == "bf16") {
    KVQ_CHECK(!spec.per_channel, "KV cache {} is not supported: per_channel is only for kivi2/kivi4 keys ({})", combo,
              kSupported);
    return std::make_unique<Bf16Codec>(spec.head_dim, level);
  }
  const int bits = type_bits(spec.type);
  KVQ_CHECK(bits != 0, "KV cache {} is not supported: unknown type ({})", combo, kSupported);
  KVQ_CHECK(spec.group == 32 || spec.group == 64 || spec.group == 128,
            "KV cache {} is not supported: group must be 32, 64 or 128 ({})", combo, kSupported);
  KVQ_CHECK(std::isfinite(spec.clip) && spec.clip > 0.f && spec.clip <= 1.f,
            "KV cache {} is not supported: clip {} must be in (0, 1] ({})", combo, spec.clip, kSupported);
  if (spec.per_channel) {
    KVQ_CHECK(kivi, "KV cache {} is not supported: per_channel is only for kivi2/kivi4 keys ({})", combo,
              kSupported);
    return std::make_unique<KiviKeyCodec>(spec.head_dim, spec.group, bits, spec.clip, level);
  }
  KVQ_CHECK(spec.head_dim % spec.group == 0,
            "KV cache {} is not supported: group must divide head_dim for per-token rows ({})", combo, kSupported);
  return std::make_unique<IntCodec>(spec.type, spec.head_dim, spec.group, bits, spec.clip, level);
}

std::unique_ptr<KvCodec> make_codec(const CodecSpec& spec) { return make_codec_at(spec, best_simd_level()); }

}  // namespace kvq
