// OScaR's 2-bit cache format (docs/guide/methods.md §5.4; arXiv 2605.19660, ZunhaiSu/OScaR-KV-Quant @ d2109f5): the
// block layouts, the integer-zero-point quantizer and the per-token key scale ν. THE definition shared by the CPU
// codecs (codecs/oscar/codec_oscar.h), the cache (kv/cache.cpp computes and stores ν) and the GPU
// (codecs/oscar/codec_oscar.cuh). Plain C++, KVQ_HD, every float operation an exact:: one (common/hd.h), so both
// devices store the same bits.
//
// Quantizer (keys and values, 2 bits, no clip), one group x[0, n) (keys: one channel over 32 tokens; values: 32
// consecutive channels of one token):
//   mn, mx = min, max of x;  both 0 -> mn, mx = -1, 1
//   scale = (mx - mn) / 3;  z = round(-mn / scale)                  fp32; z is an integer
//   code  = clamp(round(x / scale + z), 0, 3)                        fp32 scale and z (not the stored fp16 ones)
//   stored: fp16(scale), fp16(-z · scale);  x̂ = code · scale + zero_dequant (the stored values)
// round() is round half to even: the camp's kernel (csrc/oscar/src/include/qpack.h) rounds with nearbyintf in the
// default rounding mode and its PyTorch simulation (kv_cache_compression/quarot_utils.py) with torch.round, both
// half-to-even. A group without range (mx == mn != 0) stores scale 0 and zero_dequant fp16(mn), every code 0, as the
// camp's kernel does (x̂ = mn, exact when mn is an fp16 value); so does a range whose fp32 scale underflows to 0 (kvq's
// guard against x / 0). The camp's kernel multiplies by scale_inv = 3 / range (which the compiler may fuse with + z)
// and stores fp16(1 / scale_inv); kvq computes x / scale and stores fp16(scale) as METHODS §5.4 writes them, so a code
// can differ from the camp's kernel only where x / scale + z is within an ulp of a tie.
//
// Token scale (keys only): ν_t = sqrt(Σ_h Σ_c k̃²_{t,h,c}), the L2 norm of token t's (rotated) keys over ALL kv heads
// of the layer, fp32, summed per head in channel order and then over the heads in head order; ν <= 0 or NaN -> 1. The
// stored keys are k̃ / ν_t (fp32 division, then quantized); scores are ν_t · (q̃ · k̂_t). The cache keeps ν once per
// (token, layer) (kv/cache_layout.h: the page's token-scale region), the codecs never see it.
//
// Block layouts (codes packed as layout.h: units of 32 values, byte j of a unit holds values j, j+8, j+16, j+24):
//   key block  OscarKeyBlock<d>  32 tokens x d channels, channel c over the 32 tokens is one group:
//              OscarParams params[d]; uint8_t codes[32][d / 4] (token-major rows)             12 d bytes
//   value row  OscarValueRow<d>  one token, groups of 32 consecutive channels:
//              OscarParams params[d / 32]; uint8_t codes[d / 4]                                3 d / 8 bytes
// d = 128: keys 1536 B per 32 tokens (48 B per token), values 48 B, and ν 4 B per token per layer (4 / n_kv per token
// and kv head): 96.5 B at n_kv = 8, 3.016 bits per element (METHODS §5.4). The camp's kernels interleave their codes
// for their tiles; the format is the codes, parameters and dtypes above, and kvq keeps its own packing (layout.h),
// which its row kernels read.
#pragma once

#include <stdint.h>

#include "codecs/layout.h"
#include "common/half.h"

namespace kvq {

namespace layout {

constexpr int kOscarGroup = 32;  // tokens per key group (per channel), channels per value group (per token)
constexpr int kOscarBits = 2;

// fp16 parameters of one group: x̂ = code · scale + zero_dequant.
struct OscarParams {
  uint16_t scale;         // fp16 bits of (mx - mn) / 3, or 0 (no range)
  uint16_t zero_dequant;  // fp16 bits of -z · scale, or mn (no range)
};
static_assert(sizeof(OscarParams) == 4, "OscarParams is two fp16");

template <int D>
struct OscarKeyBlock {
  OscarParams params[D];                     // per channel, over the block's 32 tokens
  uint8_t codes[kOscarGroup][D * kOscarBits / 8];  // [token][packed channels]
};
template <int D>
struct OscarValueRow {
  OscarParams params[D / kOscarGroup];       // per group of 32 channels
  uint8_t codes[D * kOscarBits / 8];         // packed channels
};

KVQ_HD constexpr int oscar_key_params_bytes(int d) { return 4 * d; }
KVQ_HD constexpr int oscar_key_block_bytes(int d) {
  return oscar_key_params_bytes(d) + kOscarGroup * packed_bytes(d, kOscarBits);
}
KVQ_HD constexpr int oscar_value_params_bytes(int d) { return 4 * (d / kOscarGroup); }
KVQ_HD constexpr int oscar_value_row_bytes(int d) { return oscar_value_params_bytes(d) + packed_bytes(d, kOscarBits); }

static_assert(sizeof(OscarKeyBlock<128>) == 1536 && oscar_key_block_bytes(128) == 1536, "oscar keys d=128: 48 B/token");
static_assert(sizeof(OscarKeyBlock<64>) == 768 && oscar_key_block_bytes(64) == 768, "oscar keys d=64: 24 B/token");
static_assert(sizeof(OscarValueRow<128>) == 48 && oscar_value_row_bytes(128) == 48, "oscar values d=128: 48 B");
static_assert(sizeof(OscarValueRow<64>) == 24 && oscar_value_row_bytes(64) == 24, "oscar values d=64: 24 B");

}  // namespace layout

// One group's quantizer parameters.
struct OscarGroup {
  float scale;           // fp32 (mx - mn) / 3, the codes' divisor; 0: no range (every code 0)
  float zero_q;          // the integer zero point z
  fp16_t scale_bits;     // stored
  fp16_t zero_bits;      // stored: -z · scale, or mn without range
};

// The parameters of a group whose values span [mn, mx].
KVQ_HD inline OscarGroup oscar_group(float mn, float mx) {
  if (mn == 0.f && mx == 0.f) mn = -1.f, mx = 1.f;
  const float range = exact::sub(mx, mn);
  const float scale = exact::div(range, 3.f);
  OscarGroup g{};
  if (!(range > 0.f) || !(scale > 0.f)) {  // no range: x̂ = mn
    g.scale_bits = f32_to_fp16(0.f);
    g.zero_bits = f32_to_fp16(mn);
    return g;
  }
  g.scale = scale;
  g.zero_q = exact::round_even(exact::div(-mn, scale));
  g.scale_bits = f32_to_fp16(scale);
  g.zero_bits = f32_to_fp16(exact::mul(-g.zero_q, scale));
  return g;
}

// The parameters of the group x(0) .. x(n - 1) (X: i -> float): min and max in index order, then oscar_group.
template <class X>
KVQ_HD inline OscarGroup oscar_group_of(const X& x, int n) {
  float lo = x(0), hi = lo;
  for (int i = 1; i < n; ++i) {
    const float v = x(i);
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return oscar_group(lo, hi);
}

// code = clamp(round(x / scale + z), 0, 3); 0 for a group without range (and for NaN).
KVQ_HD inline uint8_t oscar_code(float x, const OscarGroup& g) {
  if (!(g.scale > 0.f)) return 0;
  const float c = exact::round_even(exact::add(exact::div(x, g.scale), g.zero_q));
  return uint8_t(c > 0.f ? (c < 3.f ? c : 3.f) : 0.f);
}

// x̂ = code · scale + zero_dequant from the stored fp16 parameters (code · scale is exact in fp32).
KVQ_HD inline float oscar_dequant(uint32_t code, fp16_t scale, fp16_t zero_dequant) {
  return exact::add(exact::mul(float(code), fp16_to_f32(scale)), fp16_to_f32(zero_dequant));
}

// --- The token scale ν (keys).

// Σ_c x_c² over one head's row x(0) .. x(d - 1) (X: c -> float), in channel order: the per-head term of ν².
template <class X>
KVQ_HD inline float token_sum_squares(const X& x, int d) {
  float s = 0.f;
  for (int c = 0; c < d; ++c) {
    const float v = x(c);
    s = exact::add(s, exact::mul(v, v));
  }
  return s;
}
// ν from Σ_h (per-head sums, added in head order): sqrt; ν <= 0 or NaN -> 1.
KVQ_HD inline float token_scale(float sum_squares) {
  const float nu = exact::sqrt(sum_squares);
  return nu > 0.f ? nu : 1.f;
}

}  // namespace kvq
