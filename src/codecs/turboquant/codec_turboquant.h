// TurboQuant's codecs (docs/guide/methods.md §5.2; formats and maths: codecs/turboquant/turboquant.h): codebook keys at
// 2, 3, 4 bits with or without the norm correction, and the uniform per-row values at 2, 3, 4 bits (the k8v4 preset's
// FP8 keys are the fp8e4m3 codec, codecs/fp8/codec_fp8.h). Each is a per-token codec (one row per block). The codebook
// keys expect keys already rotated by the shared Hadamard: the cache's KV transform does that (the codec table's
// transform column), queries are rotated once per step, so scores need no inverse rotation per key.
#pragma once

#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/turboquant/lloyd_max.h"
#include "codecs/turboquant/tq_kernels.h"
#include "simd/simd.h"

namespace kvq {

// Codebook keys: row = TqKeyRow<d, b> (codes, fp16 n). Decode: n · c (norm-corrected: n · c / ||c||).
class TqKeyCodec final : public KvCodec {
 public:
  // bits in {2, 3, 4}; head_dim a multiple of 32 (validated by make_codec). The codebook is lloyd_max_codebook(d, b).
  // level: which tile kernels scores() runs (tests force each level).
  TqKeyCodec(std::string name, int head_dim, int bits, bool norm_correction, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override;
  int bits() const { return bits_; }
  bool norm_correction() const { return norm_correction_; }
  const LloydMaxCodebook& codebook() const { return cb_; }
  std::vector<uint8_t> device_table() const override;  // the codebook: centroids | midpoints, fp32

  void encode(const float* y, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // Per tile of kTile rows: the centroid vectors c from a byte table (one byte -> its 8/b centroids; b = 3 by 24-bit
  // words), transposed, and f = n (/ ||c||) per row; then s = f · (q · c) for every query (tq_kernels.h).
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;

 private:
  // xt[c·kTile + t] <- centroid c of row t (the tile's column t); returns the row's Σ c_i² (any order: the fast
  // path's, not the canonical one).
  float centroids(const uint8_t* codes, float* xt, int t) const;

  std::string name_;
  int d_, bits_;
  bool norm_correction_;
  const LloydMaxCodebook& cb_;
  std::vector<float> byte_centroids_;  // b in {2, 4}: [256][8 / b] centroids of the codes in a byte, low bits first
  float byte_sum_sq_[256] = {};        // b in {2, 4}: Σ of the squares of a byte's centroids (the norm correction)
  tq::TileKernels kernels_;
};

// Uniform per-row values (TqValueRow<d, b>: codes, fp16 s, fp16 mn); keys work too.
class TqValueCodec final : public KvCodec {
 public:
  // bits in {2, 3, 4}; head_dim a multiple of 32 (validated by make_codec). level: the tile kernels accumulate() runs.
  TqValueCodec(std::string name, int head_dim, int bits, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override;
  int bits() const { return bits_; }

  void encode(const float* v, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // acc_i += Σ_t (p_it s_t) · code_t + (Σ_t p_it mn_t) · 1: per tile of kTile rows the codes as floats from a byte
  // table, the scale folded into the weights, the offset added once per query at the end.
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  std::string name_;
  int d_, bits_;
  std::vector<float> byte_codes_;  // b in {2, 4}: [256][8 / b] the codes of a byte as floats, low bits first
  tq::TileKernels kernels_;
};

}  // namespace kvq
