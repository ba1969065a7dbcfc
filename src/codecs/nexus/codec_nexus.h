// NexusQuant (docs/guide/methods.md §5.3; E8 lattice VQ, calibration-free): codecs nexusquant, nexusquant_strict, e8_2,
// e8_2_strict and e8_2_postrope. Per (token, kv head) row x of d values (d a power of two):
//   y = x · H (normalised Sylvester Hadamard, rotation/hadamard.h),  a = max(max_i |y_i|, 1e-8),  s = a / (L/2),
//   u = y / s (the fp32 s, as shipped), each 8-value group of u rounded to a lattice point p (codecs/nexus/e8_lattice.h);
//   stored: p and fp16(s) (saturated at 65504: a row with max|y| > 131008, far beyond KV activations, loses range).
//   decode: ŷ = p · fp16(s), x̂ = ŷ · H (H is symmetric and its own inverse).
// L = 4: NexusQuant's "2-bit" levels (2^bits, bits = 2: the vLLM backend's default and the K2V2 rows of its numbers);
// then s = max|y| / 2 is also e8_2's d. So nexusquant is NOT an 8-bit quantizer: it stores 8 bits per value, but a
// value takes one of 9 levels {-2, -1.5, ..., 2}.
//
// Two stored formats (one row = one block; positions are not stored, see kv/codec_rope.h):
//   nexusquant[_strict]  NexusRow: the fp16 scale, then one int8 code 2·p per value (-4..4), value order:
//                        2 + d bytes (130 at d = 128: 8.125 b; 66 at d = 64). E8 rule shipped or strict.
//   e8_2[_strict]        E8_2Row: the fp16 scale d = max|y| / 2, then 2-bit codes c = p + 1.5 over the 4 half-integer
//                        levels p ∈ {-1.5, -0.5, 0.5, 1.5} (u - ½ rounded half-to-even, clamped), packed as
//                        codecs/layout.h's 2-bit units (choice: the camp's llama.cpp packing order is not public):
//                        2 + d/4 bytes (34 at d = 128: 2.125 b). At d = 64 one scale per 64-value vector (choice: the
//                        scale is NexusQuant's per-vector one; 18 bytes, 2.25 b). Parity relaxed as shipped (e8_2:
//                        the 4 levels independently) or the strict D8 + ½ coset (e8_2_strict: Σ(p - ½) even).
//   e8_2_postrope        e8_2 with its keys quantized as given, post-RoPE (the ablation: no RoPE removal).
// Keys of the other rows have RoPE removed before and re-applied after: the cache wraps their key codec in a
// RopeKeyCodec (kv/codec_rope.h), so this codec only ever sees plain vectors.
//
// Fast paths fold H out of the per-row loop (once per call): scores s_t = fp16(s_t) · ⟨q H, p_t⟩, accumulate acc +=
// (Σ_t w_t fp16(s_t) p_t) · H. e8_2's p = c - 1.5 are int2 codes with a fixed zero, so its rows go through the SIMD row
// kernels (simd/simd.h, plain codes: Σ q'·c and Σ w·c, the 1.5 term subtracted once); nexusquant's signed int8 codes
// through 8-lane float loops (codecs/float_dot.h). The scalar references decode every row (KvCodec::*_ref).
#pragma once

#include <cstdint>
#include <string>

#include "codecs/codec.h"
#include "codecs/nexus/e8_lattice.h"
#include "codecs/nexus/nexus_format.h"
#include "simd/simd.h"

namespace kvq {

class NexusCodec final : public KvCodec {
 public:
  // name: the codec-table name reported by name(); head_dim a power of two in [32, 256] (checked). level: which row
  // kernels e8_2's scores()/accumulate() run (tests force each level).
  NexusCodec(std::string name, int head_dim, NexusFormat format, E8Rule rule, SimdLevel level = best_simd_level());

  std::string_view name() const override { return name_; }
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override { return size_t(nexus_row_bytes(format_, d_)); }
  NexusFormat format() const { return format_; }
  E8Rule rule() const { return rule_; }

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  // decode's rows 8 at a time: the points of 8 rows side by side, so that every butterfly of the Hadamard is one
  // 8-wide vector operation (the same operations per value as decode: the same floats).
  void decode_rows(const uint8_t* blocks, int n_blocks, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

  // The stored lattice point p[0..d) of a block (in the Hadamard domain) and its fp16 scale as a float.
  float points(const uint8_t* block, float* p) const;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;  // e8_2 rows as plain int2 codes for the row kernels
  float scale(const uint8_t* blocks, int t) const;             // fp16(s) of row t

  std::string name_;
  int d_;               // values per row
  NexusFormat format_;  // stored codes
  E8Rule rule_;         // nearest-point rule
  RowKernels kernels_;  // int2 row kernels (e8_2)
};

}  // namespace kvq
