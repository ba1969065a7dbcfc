// Keys stored without RoPE (docs/guide/methods.md §5.3: NexusQuant removes RoPE from a key before quantizing it and
// re-applies it after dequantizing). The model hands the cache post-RoPE keys; a cache whose key codec's row has
// pre_rope_keys (codecs/registry.h) wraps that codec in a RopeKeyCodec, the one positional codec (codecs/codec.h):
//   encode_at(x, pos0)   x_r -> RoPE^-1 at pos0 + r (rotation/rope.h, the model's frequencies), then the inner encode
//   decode_at(b, pos0)   the inner decode, then RoPE at pos0 + r
//   scores_at            q · RoPE_pos(x̂_t): each piece's rows decoded into a scratch [n, d], rotated with the
//                        angles of their positions, then the dots (the fast path); scores_ref_at (KvCodec) is
//                        decode_at per row + plain loops.
// Decode cost: without RoPE removal the inner codec's Hadamard folds into q once per call (as QuaRot's); with it
// every key is decoded (inverse Hadamard) and re-rotated at its own position before the dot. The cos / sin of every
// position the cache holds are computed once (rope_angles, the same values rope_rows uses) into a table of
// 4·d bytes per position (up to kMaxAngleTable positions; later ones are computed per call): it is not KV storage.
//
// Positions are NOT stored. NexusQuant's vLLM page keeps an int32 absolute position per token because vLLM's blocks
// do not know their positions; kvq's cache does (sinks are [0, S0), page i of a sequence covers [S0 + i P, ...), the
// ring slot of position s is s % ring), so kvq stores nothing for them and counts nothing (bytes_per_block is the
// inner codec's).
#pragma once

#include <memory>
#include <vector>

#include "codecs/codec.h"
#include "kv/cache.h"

namespace kvq {

inline constexpr int kMaxAngleTable = 1 << 16;  // positions whose cos / sin a RopeKeyCodec keeps (32 MiB at d = 128)

class RopeKeyCodec final : public KvCodec {
 public:
  // inv_freq: head_dim / 2 RoPE inverse frequencies (ModelConfig::rope_inv_freq), checked. max_positions: positions
  // [0, max_positions) get their angles tabulated (the cache's max_ctx; 0: none, computed per call).
  RopeKeyCodec(std::unique_ptr<KvCodec> inner, std::vector<float> inv_freq, int max_positions = 0);

  std::string_view name() const override { return inner_->name(); }
  int head_dim() const override { return inner_->head_dim(); }
  int tokens_per_block() const override { return inner_->tokens_per_block(); }
  size_t bytes_per_block() const override { return inner_->bytes_per_block(); }
  const KvCodec& inner() const { return *inner_; }

  bool positional() const override { return true; }
  void encode_at(const float* x, int pos0, uint8_t* block) const override;
  void decode_at(const uint8_t* block, int pos0, float* x) const override;
  void scores_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const override;

  // Position-free calls: refused (kvq::Error), a row's RoPE needs its position.
  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  // cos and sin [head_dim / 2 each] of position pos: from the table, or computed into scratch [head_dim].
  const float* angles(int pos, float* scratch) const;

  std::unique_ptr<KvCodec> inner_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<float> angles_;    // [positions][cos: d / 2, sin: d / 2]
};

// The key codec of a cache of cfg at head_dim: cfg.k's codec, wrapped in a RopeKeyCodec when its row stores keys
// without RoPE. That needs cfg.key_rope (head_dim / 2 frequencies, from the model) and no KV transform (the keys must
// reach the cache as the model's post-RoPE keys); kvq::Error naming what is missing otherwise. max_positions: see
// RopeKeyCodec. A per_head row (PN-Mix keys) gets the codec of (layer, kv_head), and refuses a key-side transform too
// (its widths were calibrated on the model's own post-RoPE keys); with --kv-scales (cfg.kv_scales) the codec of layer
// (its k_scale); other codecs are the same for every head.
std::unique_ptr<KvCodec> make_key_codec(const CacheConfig& cfg, int head_dim, int max_positions = 0, int layer = 0,
                                        int kv_head = 0);
// The value codec of a cache of cfg at head_dim for layer (with --kv-scales, its v_scale; the same for every layer
// otherwise).
std::unique_ptr<KvCodec> make_value_codec(const CacheConfig& cfg, int head_dim, int layer = 0);

}  // namespace kvq
