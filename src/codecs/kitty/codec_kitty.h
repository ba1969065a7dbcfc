// Kitty (docs/guide/methods.md §5.5; codecs kitty_int2 and kitty_int2_20): dynamic channel-wise precision boost. The
// host codecs of its key blocks and value rows; the format they store: codecs/kitty/kitty_format.h.
#pragma once

#include <string>

#include "codecs/codec.h"
#include "codecs/kitty/kitty_format.h"
#include "simd/simd.h"

namespace kvq {

// The channel map of a key block x [128][d] (token-major): slot[c] = rank of channel c by score_c = mean_t |x_tc|
// (descending, ties to the lower index) when below n_boost, else n_boost.
void kitty_channel_map(const float* x, int d, int n_boost, uint8_t* slot);

class KittyKeyCodec final : public KvCodec {
 public:
  // name: the codec table's ("kitty_int2", "kitty_int2_20"); boost_percent 25 or 20. Validated by make_codec.
  KittyKeyCodec(std::string name, int head_dim, int boost_percent, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return layout::kKittyBlockTokens; }
  size_t bytes_per_block() const override { return size_t(layout::kitty_key_block_bytes(d_, n_boost_)); }
  int n_boost() const { return n_boost_; }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Per block, with q'_c = q_c · scale_c: s_t = Σ_c q'_c low_ct + Σ_j 4 q'_{ch(j)} high_jt + Σ_c q_c min_c — the
  // plane rows read by the row kernels' weighted sum (rows = channels, values = tokens).
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  // Per block: acc_c += scale_c · (Σ_t p_t low_ct + 4 Σ_t p_t high_{slot(c),t}) + min_c · Σ_t p_t (row kernel dots).
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  std::string name_;
  int d_;               // channels per token
  int n_boost_;         // boosted channels per block
  RowKernels kernels_;  // int2 plane rows of 128 values
};

class KittyValueCodec final : public KvCodec {
 public:
  KittyValueCodec(std::string name, int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(layout::kitty_value_row_bytes(d_)); }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // s_t = scale_t · (q · code_t) + min_t · Σ q;  acc += Σ_t (p_t scale_t) code_t + Σ_t p_t min_t.
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;

  std::string name_;
  int d_;  // values per row
  RowKernels kernels_;
};

}  // namespace kvq
