// llama.cpp's KV-cache block formats (q8_0, q5_0, q4_1, q4_0, iq4_nl), mirrored from ggml's block_* structs
// (ggml/src/ggml-common.h) and bit-exact to its reference quantizers quantize_row_*_ref and its dequantizers
// dequantize_row_* (ggml/src/ggml-quants.c). Spec: docs/research/llamacpp-kv.md §2; golden bytes made by llama.cpp
// itself: tests/golden/llamacpp_kv_blocks.README.md.
//
// Shared by every format: 32 values per block; scales are IEEE fp16 rounded to nearest even (common/half.h, the
// same bits as ggml's GGML_FP32_TO_FP16); the codes come from the UNROUNDED f32 scale and decoding uses the stored
// fp16 one; 4-bit payloads are packed by halves: byte j holds value j (low nibble) and value j + 16 (high nibble).
// Every float operation is one IEEE operation in ggml's order (exact::, common/hd.h), so that the host and a device
// store the same bits. Non-finite inputs have no defined result in ggml (a float-to-int8 conversion out of range);
// here they give some codes, never a crash.
#pragma once

#include <stdint.h>

#include "common/half.h"
#include "common/hd.h"

namespace kvq::llamacpp {

constexpr int kBlockValues = 32;  // QK8_0 = QK5_0 = QK4_1 = QK4_0 = QK4_NL

// x̂_j = d·qs[j], qs in [-127, 127].  8.5 bits / value.
struct BlockQ8_0 {
  fp16_t d;       // amax / 127
  int8_t qs[32];  // round(x / d), half away from zero
};
// x̂_j = d·(q_j − 16), q_j = qs nibble | (bit j of qh) << 4 in [0, 31].  5.5 bits / value.
struct BlockQ5_0 {
  fp16_t d;       // m / −16, m the signed largest-magnitude value
  uint8_t qh[4];  // bit 4 of q_j at bit j of this little-endian uint32
  uint8_t qs[16]; // bits 0-3, packed by halves
};
// x̂_j = d·q_j + m, q_j in [0, 15].  5 bits / value.
struct BlockQ4_1 {
  fp16_t d;       // (max − min) / 15
  fp16_t m;       // min
  uint8_t qs[16]; // packed by halves
};
// x̂_j = d·(q_j − 8), q_j in [0, 15].  4.5 bits / value.
struct BlockQ4_0 {
  fp16_t d;       // m / −8, m the signed largest-magnitude value
  uint8_t qs[16]; // packed by halves
};
// x̂_j = d·T[q_j] with the fixed non-linear table T below.  4.5 bits / value.
struct BlockIq4Nl {
  fp16_t d;       // x²-weighted least-squares scale for the codes of m / −127
  uint8_t qs[16]; // table indices, packed by halves
};
static_assert(sizeof(BlockQ8_0) == 34, "block_q8_0: fp16 + 32 int8");
static_assert(sizeof(BlockQ5_0) == 22, "block_q5_0: fp16 + uint32 + 16 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "block_q4_1: 2 fp16 + 16 bytes");
static_assert(sizeof(BlockQ4_0) == 18, "block_q4_0: fp16 + 16 bytes");
static_assert(sizeof(BlockIq4Nl) == 18, "block_iq4_nl: fp16 + 16 bytes");

// T = kvalues_iq4nl: finest near zero, the negative end longer than the positive one, no zero entry.
KVQ_HD constexpr int iq4nl_value(int i) {
  constexpr int8_t kT[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return kT[i];
}

// The 4-bit code of value j from payload packed by halves.
KVQ_HD inline int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }
KVQ_HD inline void pack_nibbles(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(codes[j] | (codes[j + 16] << 4));
}

// float -> int8_t as ggml's C casts do: truncation toward zero (the argument is >= 0 wherever ggml uses it, so
// this is floor).
KVQ_HD inline int trunc_to_int8(float v) { return int(int8_t(int(v))); }

// The signed value of the first largest-magnitude element (a later one replaces it only when strictly larger).
KVQ_HD inline float signed_absmax(const float* x) {
  float amax = 0.f, m = 0.f;
  for (int j = 0; j < kBlockValues; ++j)
    if (amax < exact::abs(x[j])) amax = exact::abs(x[j]), m = x[j];
  return m;
}

// --- quantize: one block of 32 values x, as quantize_row_*_ref.

// q4_0 / q5_0: d = m / −2^(b−1) (the scale's sign opposite to m's, so m gets code 0), codes
// min(2^b − 1, trunc(x/d + 2^(b−1) + ½)): round half up in code space, the far side saturating at (2^(b−1) − 1)·|d|.
KVQ_HD inline float absmax_codes(const float* x, int half_levels, uint8_t* codes) {
  const float d = exact::div(signed_absmax(x), float(-half_levels));
  const float id = d != 0.f ? exact::div(1.f, d) : 0.f;
  const float bias = float(half_levels) + 0.5f;
  for (int j = 0; j < kBlockValues; ++j) {
    const int q = trunc_to_int8(exact::add(exact::mul(x[j], id), bias));
    codes[j] = uint8_t(q < 2 * half_levels - 1 ? q : 2 * half_levels - 1);
  }
  return d;
}

KVQ_HD inline void quantize(const float* x, BlockQ4_0& b) {
  uint8_t codes[kBlockValues];
  b.d = f32_to_fp16(absmax_codes(x, 8, codes));
  pack_nibbles(codes, b.qs);
}

KVQ_HD inline void quantize(const float* x, BlockQ5_0& b) {
  uint8_t codes[kBlockValues];
  b.d = f32_to_fp16(absmax_codes(x, 16, codes));
  uint8_t low[kBlockValues];
  uint32_t qh = 0;
  for (int j = 0; j < kBlockValues; ++j) {
    low[j] = codes[j] & 0x0f;
    qh |= uint32_t(codes[j] >> 4) << j;
  }
  pack_nibbles(low, b.qs);
  for (int i = 0; i < 4; ++i) b.qh[i] = uint8_t(qh >> (8 * i));
}

// q4_1: d = (max − min) / 15, m = min; codes min(15, trunc((x − min)/d + ½)).
KVQ_HD inline void quantize(const float* x, BlockQ4_1& b) {
  float lo = 3.40282347e38f, hi = -3.40282347e38f;  // ±FLT_MAX, as ggml starts
  for (int j = 0; j < kBlockValues; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  const float d = exact::div(exact::sub(hi, lo), 15.f);
  const float id = d != 0.f ? exact::div(1.f, d) : 0.f;
  uint8_t codes[kBlockValues];
  for (int j = 0; j < kBlockValues; ++j) {
    const int q = trunc_to_int8(exact::add(exact::mul(exact::sub(x[j], lo), id), 0.5f));
    codes[j] = uint8_t(q < 15 ? q : 15);
  }
  b.d = f32_to_fp16(d);
  b.m = f32_to_fp16(lo);
  pack_nibbles(codes, b.qs);
}

// q8_0: d = amax / 127, codes round(x/d), ties away from zero.
KVQ_HD inline void quantize(const float* x, BlockQ8_0& b) {
  float amax = 0.f;
  for (int j = 0; j < kBlockValues; ++j) amax = amax > exact::abs(x[j]) ? amax : exact::abs(x[j]);  // ggml's MAX
  const float d = exact::div(amax, 127.f);
  const float id = d != 0.f ? exact::div(1.f, d) : 0.f;
  b.d = f32_to_fp16(d);
  for (int j = 0; j < kBlockValues; ++j) b.qs[j] = int8_t(int(exact::round_away(exact::mul(x[j], id))));
}

// iq4_nl's nearest table entry (best_index_int8): the ends clamp; inside, the nearer of the two bracketing entries,
// an exact midpoint (as the two float differences compare) going to the upper one.
KVQ_HD inline int iq4nl_nearest(float v) {
  if (v <= float(iq4nl_value(0))) return 0;
  if (v >= float(iq4nl_value(15))) return 15;
  int lo = 0;  // the last entry <= v
  while (float(iq4nl_value(lo + 1)) <= v) ++lo;
  return exact::sub(v, float(iq4nl_value(lo))) < exact::sub(float(iq4nl_value(lo + 1)), v) ? lo : lo + 1;
}

// iq4_nl as the CPU KV write runs it (quantize_row_iq4_nl_ref: ntry = −1, i.e. no scale search): codes for
// d0 = m / −127 (m lands on T[0] = −127), then one x²-weighted least-squares refit of the scale keeping those codes:
// d = Σ w·T[q]·x / Σ w·T[q]², w = x². A block with max|x| < 1e-15 stores d = 0; ggml leaves its codes as scratch
// (whatever its buffer held), kvq stores code 0 (any code decodes to 0 there).
KVQ_HD inline void quantize(const float* x, BlockIq4Nl& b) {
  uint8_t codes[kBlockValues] = {};
  float d = 0.f;
  const float m = signed_absmax(x);
  if (!(exact::abs(m) < 1e-15f)) {
    const float id = exact::div(1.f, exact::div(m, float(iq4nl_value(0))));
    float sumqx = 0.f, sumq2 = 0.f;
    for (int j = 0; j < kBlockValues; ++j) {
      codes[j] = uint8_t(iq4nl_nearest(exact::mul(id, x[j])));
      const float q = float(iq4nl_value(codes[j])), w = exact::mul(x[j], x[j]);
      sumqx = exact::add(sumqx, exact::mul(exact::mul(w, q), x[j]));
      sumq2 = exact::add(sumq2, exact::mul(exact::mul(w, q), q));
    }
    d = sumq2 > 0.f ? exact::div(sumqx, sumq2) : 0.f;
  }
  b.d = f32_to_fp16(d);
  pack_nibbles(codes, b.qs);
}

// --- levels and values: x̂_j = d·level_j (+ m for q4_1), as dequantize_row_* computes it.

KVQ_HD inline int level(const BlockQ8_0& b, int j) { return b.qs[j]; }
KVQ_HD inline int level(const BlockQ5_0& b, int j) {
  const uint32_t qh = uint32_t(b.qh[0]) | uint32_t(b.qh[1]) << 8 | uint32_t(b.qh[2]) << 16 | uint32_t(b.qh[3]) << 24;
  return (nibble(b.qs, j) | int((qh >> j) & 1u) << 4) - 16;
}
KVQ_HD inline int level(const BlockQ4_1& b, int j) { return nibble(b.qs, j); }
KVQ_HD inline int level(const BlockQ4_0& b, int j) { return nibble(b.qs, j) - 8; }
KVQ_HD inline int level(const BlockIq4Nl& b, int j) { return iq4nl_value(nibble(b.qs, j)); }

template <class Block>
KVQ_HD inline float value(const Block& b, int j) {
  return exact::mul(float(level(b, j)), fp16_to_f32(b.d));
}
KVQ_HD inline float value(const BlockQ4_1& b, int j) {
  return exact::add(exact::mul(float(level(b, j)), fp16_to_f32(b.d)), fp16_to_f32(b.m));
}

}  // namespace kvq::llamacpp
