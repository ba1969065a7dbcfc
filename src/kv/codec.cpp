#include "kv/codec.h"

#include <vector>

#include "common/error.h"
#include "kv/codec_bf16.h"
#include "kv/codec_f32.h"

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

std::unique_ptr<KvCodec> make_codec(const CodecSpec& spec) {
  KVQ_CHECK(spec.head_dim > 0 && spec.head_dim % 32 == 0 && spec.head_dim <= 256,
            "KV cache: head_dim {} is not supported (supported: multiples of 32 up to 256)", spec.head_dim);
  if (spec.type == "bf16") return std::make_unique<Bf16Codec>(spec.head_dim);
  if (spec.type == "f32") return std::make_unique<F32Codec>(spec.head_dim);
  KVQ_FAIL("KV cache type '{}' is not supported (supported: f32, bf16)", spec.type);
}

}  // namespace kvq
