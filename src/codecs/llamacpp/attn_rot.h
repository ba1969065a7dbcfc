// llama.cpp's KV rotation ("attn_rot", docs/research/llamacpp-kv.md §3) as a kvq KV transform (kv/transform.h).
//
// llama.cpp multiplies the post-RoPE query and key of every head by H_nk and the value by H_nv, slice by slice along
// head_dim, and the attention output by H_nv again before the output projection. H_n is the Sylvester Walsh–Hadamard
// matrix / √n (entry (−1)^popcount(i & j) / √n: no random signs, no permutation, no seed; the same matrix for every
// layer, head and token), symmetric and its own inverse, so kvq's R_K = R_V = blockdiag(H_n, ..., H_n) in row-vector
// convention is exactly it. When it is on (llama_kv_cache's constructor):
//   K: the key cache type is quantized and head_dim % 64 == 0; n_k = the largest power of two >= 64 dividing head_dim
//      (64 -> 64, 128 -> 128, 192 -> 64)
//   V: the value cache type is quantized and head_dim % 64 == 0; n_v = 64 always (block-diagonal for head_dim > 64)
// K and V decide independently (-ctk q8_0 -ctv f16 rotates keys only). f16 / bf16 / f32 caches are never rotated.
// In kvq the quantized types that imply it are the codec table's rows whose transform is "attn_rot" (llama.cpp's
// block types). llama.cpp's LLAMA_ATTN_ROT_DISABLE turns both off; kvq's CLI has --attn-rot off too (cli/options.h).
#pragma once

#include <string>

#include "kv/cache.h"
#include "kv/transform.h"

namespace kvq {

struct AttnRot {
  int head_dim = 0;
  int n_k = 0;  // Hadamard size for keys and queries; 0: not rotated
  int n_v = 0;  // Hadamard size for values and outputs; 0: not rotated
  bool on() const { return n_k > 0 || n_v > 0; }
  std::string describe() const;  // "k H_128, v H_64 (2 blocks per head)", "k H_128, v off", "off"
};

// The largest power of two >= 64 that divides head_dim; 0 when head_dim % 64 != 0.
int attn_rot_k_size(int head_dim);

// What llama.cpp turns on for this cache's key and value types at head_dim (the codec table's transform column).
AttnRot attn_rot_for(const CacheConfig& cache, int head_dim);

// The transform: R_K = blockdiag(H_n_k) (empty if n_k = 0), R_V = blockdiag(H_n_v), for every layer and kv head; no
// key centring. Named "attn_rot" (both), "attn_rot_k" or "attn_rot_v".
KvTransform attn_rot_transform(const AttnRot& rot, int n_layers, int n_kv_heads, int head_dim);

}  // namespace kvq
