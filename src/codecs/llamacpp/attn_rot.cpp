#include "codecs/llamacpp/attn_rot.h"

#include <fmt/format.h>

#include "codecs/registry.h"
#include "common/error.h"
#include "rotation/hadamard.h"

namespace kvq {

namespace {

bool implies_attn_rot(const CodecSpec& s) { return codec_traits(s.type).transform == CodecTransform::kAttnRot; }

// "H_128", "H_64 (2 blocks per head)" or "off".
std::string one(int n, int d) {
  if (n == 0) return "off";
  return n == d ? fmt::format("H_{}", n) : fmt::format("H_{} ({} blocks per head)", n, d / n);
}

}  // namespace

std::string AttnRot::describe() const {
  return on() ? fmt::format("k {}, v {}", one(n_k, head_dim), one(n_v, head_dim)) : "off";
}

int attn_rot_k_size(int head_dim) {
  if (head_dim <= 0 || head_dim % 64 != 0) return 0;
  int n = 64;
  while (head_dim % (2 * n) == 0) n *= 2;
  return n;
}

AttnRot attn_rot_for(const CacheConfig& cache, int head_dim) {
  AttnRot r;
  r.head_dim = head_dim;
  if (head_dim % 64 != 0) return r;  // head_dim 32, 80, 96: llama.cpp rotates nothing
  if (implies_attn_rot(cache.k)) r.n_k = attn_rot_k_size(head_dim);
  if (implies_attn_rot(cache.v)) r.n_v = 64;
  return r;
}

KvTransform attn_rot_transform(const AttnRot& rot, int n_layers, int n_kv_heads, int head_dim) {
  KVQ_CHECK(rot.on(), "attn_rot_transform: neither keys nor values are rotated");
  KVQ_CHECK(rot.head_dim == head_dim && (rot.n_k == 0 || head_dim % rot.n_k == 0) &&
                (rot.n_v == 0 || head_dim % rot.n_v == 0),
            "attn_rot: Hadamard sizes k {} v {} (for head_dim {}) do not fit head_dim {}", rot.n_k, rot.n_v,
            rot.head_dim, head_dim);
  KvTransform t;
  t.n_layers = n_layers;
  t.n_kv_heads = n_kv_heads;
  t.head_dim = head_dim;
  t.name = std::string(transform_name(CodecTransform::kAttnRot)) + (rot.n_k && rot.n_v ? "" : rot.n_k ? "_k" : "_v");
  if (rot.n_k) t.r_k = block_hadamard(rot.n_k, head_dim, n_layers * n_kv_heads), t.k_hadamard = rot.n_k;
  if (rot.n_v) t.r_v = block_hadamard(rot.n_v, head_dim, n_layers * n_kv_heads), t.v_hadamard = rot.n_v;
  return t;
}

}  // namespace kvq
