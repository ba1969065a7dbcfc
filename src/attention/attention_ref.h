// Scalar reference of decode-faithful cache attention (the spec attention.cpp is tested against): keeps the raw
// key/value rows of one sequence and one layer, builds every row as decode would hold it, and runs a plain softmax
// in double. Written independently of KvCache's storage; short and slow on purpose.
//
// Row of position pos as read by a query at t (kv/cache.h, docs/guide/methods.md §2):
//   pos < S0 or pos >= qe(t):  the window codec's decode(encode(x))                       (bf16-rounded rows)
//   S0 <= pos < qe(t):         the K / V codec's decode_at(encode_at(block)) of the window-codec rows of pos's block;
//                              token-scaled keys: ν_t · decode_at(encode_at(rows / ν_t)), ν_t over all kv heads;
//                              a quantized window codec (int8, METHODS §5.6): of the BF16 rows bf16(x) instead
//   qe(t) = S0 + (number of whole B-token blocks after the sinks whose last token has left the W-token window), B =
//           CacheConfig::demote_block when set, else the lcm of the codecs' tokens per block
#pragma once

#include <memory>
#include <vector>

#include "kv/cache.h"

namespace kvq {

class ReferenceKv {
 public:
  ReferenceKv(const CacheConfig& cfg, int n_kv_heads, int head_dim);
  ~ReferenceKv();

  // Raw rows of positions [length(), length() + n): k, v [n, n_kv_heads, d], as given to KvCache::append.
  void append(int n, const float* k, const float* v);
  int length() const { return n_tokens_; }
  int block_tokens() const { return block_; }
  int quant_end(int t) const;  // qe(t), counted block by block

  // Key / value row [d] of pos (<= t) as the query at t reads it.
  const float* key(int t, int pos, int kv_head) const;
  const float* value(int t, int pos, int kv_head) const;

  // out [n_heads, d] = softmax(q · K^T) V for one query at t over positions [0, t], or (t - w, t] under a sliding
  // window w = cfg.attn_window_of(0); q [n_heads, d] already scaled; query head j uses kv head j / (n_heads /
  // n_kv_heads). Double precision throughout.
  void attend(int t, const float* q, int n_heads, double* out) const;

 private:
  const float* row(const std::vector<float>& window, const std::vector<float>& quant, int t, int pos, int h) const;

  CacheConfig cfg_;
  int n_kv_, d_, block_;
  std::unique_ptr<KvCodec> k_codec_, v_codec_, window_;
  std::vector<std::unique_ptr<KvCodec>> head_k_codecs_;  // [n_kv] per_head key codecs (layer 0); empty otherwise
  int n_tokens_ = 0;
  int n_quantized_ = 0;                     // positions [S0, S0 + n_quantized_) have quantized twins
  std::vector<float> wk_, wv_;              // [n_tokens, n_kv, d] window-codec round trips
  std::vector<float> sk_, sv_;              // [n_tokens, n_kv, d] what is quantized: wk_ / wv_, or bf16(x)
  std::vector<float> qk_, qv_;              // [n_tokens, n_kv, d] K / V codec round trips (whole blocks only)
};

}  // namespace kvq
