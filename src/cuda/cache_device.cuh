// Device-side helpers shared by the cache kernels: the bit-exact twins of common/half.h, the decode-faithful
// view's rows (sink, page, ring; KIVI key blocks) and the decoding of stored rows (kv/layout.h formats).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/gpu_kernels.h"
#include "kv/layout.h"

namespace kvq::cuda::dev {

// --- common/half.h, bit for bit (round to nearest even, same overflow and subnormal handling).
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float fp16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }  // exact

__device__ __forceinline__ uint16_t f32_to_fp16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (abs < 0x38800000u) return uint16_t(sign | uint32_t(rintf(__fmul_rn(__uint_as_float(abs), 16777216.0f))));
  uint32_t v = abs - 0x38000000u;
  v += 0xfffu + ((v >> 13) & 1u);
  return uint16_t(sign | (v >> 13));
}

// --- The decode-faithful view of a query at position t: cuda::quant_end (gpu_kernels.h), block_tokens B.

__device__ __forceinline__ const uint16_t* sink_row(const CacheGeometry& g, int seq, int layer, int kv, int head,
                                                    int pos) {
  return g.sinks + ((((int64_t(seq) * g.n_layers + layer) * 2 + kv) * g.n_kv + head) * g.sink + pos) * kHeadDim;
}
__device__ __forceinline__ uint16_t* ring_row(const CacheGeometry& g, int seq, int layer, int kv, int head, int pos) {
  return g.ring +
         ((((int64_t(seq) * g.n_layers + layer) * 2 + kv) * g.n_kv + head) * g.ring_tokens + pos % g.ring_tokens) *
             kHeadDim;
}
// The (layer, head) part of pool page `page`: { K blocks | V rows }.
__device__ __forceinline__ uint8_t* page_head_at(const CacheGeometry& g, int page, int layer, int head) {
  return g.pool + int64_t(page) * g.page_bytes + (int64_t(layer) * g.n_kv + head) * g.head_bytes;
}
// The (layer, head) part of the page holding quantized position pos >= S0.
__device__ __forceinline__ uint8_t* page_head(const CacheGeometry& g, int seq, int layer, int head, int pos) {
  const int q = pos - g.sink;
  return page_head_at(g, g.page_table[int64_t(seq) * g.pages_per_seq + q / g.page_tokens], layer, head);
}
// Stored (quantized-region) row of position pos >= S0: every V row, and K rows of per-token key codecs (NOT KIVI
// keys: see kivi_block).
__device__ __forceinline__ uint8_t* page_row(const CacheGeometry& g, int seq, int layer, int kv, int head, int pos) {
  const int j = (pos - g.sink) % g.page_tokens;
  uint8_t* h = page_head(g, seq, layer, head, pos);
  return kv ? h + g.k_region + int64_t(j) * g.v_row : h + int64_t(j) * g.k_row;
}
// KIVI keys: the layout::KiviKeyBlock holding quantized position pos >= S0; the position is its row
// (pos - S0) % G.
__device__ __forceinline__ uint8_t* kivi_block(const CacheGeometry& g, int seq, int layer, int head, int pos) {
  const int j = (pos - g.sink) % g.page_tokens;
  return page_head(g, seq, layer, head, pos) + int64_t(j / g.k_block_tokens) * g.k_block;
}

// Where row `pos` of the view of a query at t lives: a bf16 row (sink / recent), a codec row (quantized), or for
// KIVI keys in the quantized region the key block and the row within it.
struct RowRef {
  const void* ptr;  // bf16 row, codec row, or layout::KiviKeyBlock
  bool quant;       // in the quantized region
  int block_row;    // KIVI keys: the token's row in the block (0 .. G - 1); 0 otherwise
};
__device__ __forceinline__ RowRef view_row(const CacheGeometry& g, int seq, int layer, int kv, int head, int pos,
                                           int qe) {
  if (pos < g.sink) return {sink_row(g, seq, layer, kv, head, pos), false, 0};
  if (pos < qe) {
    if (kv == 0 && kivi_keys(g))
      return {kivi_block(g, seq, layer, head, pos), true, (pos - g.sink) % g.k_block_tokens};
    return {page_row(g, seq, layer, kv, head, pos), true, 0};
  }
  return {ring_row(g, seq, layer, kv, head, pos), false, 0};
}

// Value c of a stored row: bf16 (bits == kBf16Bits) or layout::IntRow with group G.
__device__ __forceinline__ float row_value(const void* row, int bits, int group, int c) {
  if (bits == kBf16Bits) return bf16_to_f32(static_cast<const uint16_t*>(row)[c]);
  const uint8_t* r = static_cast<const uint8_t*>(row);
  const uint16_t* params = reinterpret_cast<const uint16_t*>(r);  // rows are 4-byte aligned (sizes are multiples of 4)
  const int gi = c / group;
  const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
  const uint8_t* codes = r + layout::int_row_params_bytes(kHeadDim, group);
  const int code = (codes[layout::code_byte(c, bits)] >> layout::code_shift(c, bits)) & ((1 << bits) - 1);
  return (float(code) - zero) * scale;
}

// Value c of row `row` of a KIVI key block (layout::KiviKeyBlock, d = kHeadDim): (code - zero_c) · scale_c.
__device__ __forceinline__ float kivi_value(const void* block, int row, int bits, int c) {
  const uint8_t* b = static_cast<const uint8_t*>(block);
  const uint16_t* params = reinterpret_cast<const uint16_t*>(b);  // GroupParams[d]: scale, zero of channel c
  const float scale = fp16_to_f32(params[2 * c]), zero = fp16_to_f32(params[2 * c + 1]);
  const uint8_t* codes = b + layout::kivi_key_params_bytes(kHeadDim) + row * layout::packed_bytes(kHeadDim, bits);
  const int code = (codes[layout::code_byte(c, bits)] >> layout::code_shift(c, bits)) & ((1 << bits) - 1);
  return (float(code) - zero) * scale;
}

// Four consecutive values c0 .. c0 + 3 (c0 a multiple of 4) of row `row` of a KIVI key block.
__device__ __forceinline__ void kivi_values4(const void* block, int row, int bits, int c0, float out[4]) {
  const uint8_t* b = static_cast<const uint8_t*>(block);
  const uint32_t* params = reinterpret_cast<const uint32_t*>(b);  // one word per channel: scale (low), zero (high)
  // As row_values4: values c0 .. c0 + 3 sit in 4 consecutive bytes of their unit at the same shift.
  const int ub = layout::unit_bytes(bits), vv = c0 % layout::kUnitValues;
  const uint32_t w = *reinterpret_cast<const uint32_t*>(b + layout::kivi_key_params_bytes(kHeadDim) +
                                                        row * layout::packed_bytes(kHeadDim, bits) +
                                                        (c0 / layout::kUnitValues) * ub + vv % ub);
  const int shift = bits * (vv / ub), mask = (1 << bits) - 1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t p = params[c0 + i];
    const float scale = fp16_to_f32(uint16_t(p)), zero = fp16_to_f32(uint16_t(p >> 16));
    out[i] = (float((w >> (8 * i + shift)) & mask) - zero) * scale;
  }
}

// Value c of the K row `r` (view_row with kv = 0): bf16 window row, per-token codec row or KIVI key block.
__device__ __forceinline__ float key_value(const CacheGeometry& g, const RowRef& r, int c) {
  if (r.quant && kivi_keys(g)) return kivi_value(r.ptr, r.block_row, g.k_bits, c);
  return row_value(r.ptr, r.quant ? g.k_bits : kBf16Bits, g.k_group, c);
}

// Four consecutive values c0 .. c0 + 3 (c0 a multiple of 4) of a stored row.
__device__ __forceinline__ void row_values4(const void* row, int bits, int group, int c0, float out[4]) {
  if (bits == kBf16Bits) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(row) + c0);  // 8-byte aligned
    out[0] = __uint_as_float(w.x << 16);
    out[1] = __uint_as_float(w.x & 0xffff0000u);
    out[2] = __uint_as_float(w.y << 16);
    out[3] = __uint_as_float(w.y & 0xffff0000u);
    return;
  }
  const uint8_t* r = static_cast<const uint8_t*>(row);
  const uint16_t* params = reinterpret_cast<const uint16_t*>(r);
  const int gi = c0 / group;  // the 4 values share a group (G is a multiple of 32)
  const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
  // Values c0 .. c0 + 3 sit in 4 consecutive bytes of their unit at the same shift (layout.h): one aligned word.
  const int ub = layout::unit_bytes(bits), vv = c0 % layout::kUnitValues;
  const uint32_t w = *reinterpret_cast<const uint32_t*>(r + layout::int_row_params_bytes(kHeadDim, group) +
                                                        (c0 / layout::kUnitValues) * ub + vv % ub);
  const int shift = bits * (vv / ub), mask = (1 << bits) - 1;
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = (float((w >> (8 * i + shift)) & mask) - zero) * scale;
}

// Scores of one bf16 row against the g <= GQ queries qs[h][:]: s[h] += q_h · k. The whole row (16 loads of 16 bytes:
// bf16 rows start at multiples of 16 bytes, as cache_geometry lays them out) is loaded before any use, so one DRAM
// round trip serves it rather than one per 4 values.
template <int GQ>
__device__ __forceinline__ void score_bf16_row(const void* row, const float (*qs)[kHeadDim], int g, float* s) {
  const uint4* r = static_cast<const uint4*>(row);
  uint4 w[kHeadDim / 8];
#pragma unroll
  for (int i = 0; i < kHeadDim / 8; ++i) w[i] = r[i];
#pragma unroll
  for (int i = 0; i < kHeadDim / 8; ++i) {
    const uint32_t x[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = 8 * i + 2 * j;
      const float lo = __uint_as_float(x[j] << 16), hi = __uint_as_float(x[j] & 0xffff0000u);
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) s[h] = fmaf(qs[h][c + 1], hi, fmaf(qs[h][c], lo, s[h]));
    }
  }
}

// Scores of one stored int row (layout::IntRow, BITS) against the g <= GQ queries qs[h][:]: s[h] += q_h · k̂. Per unit of
// 32 values: Σ code · q accumulated, then scale · (Σ code q - zero · Σ q) with qsum[h][unit] = Σ q over the unit.
template <int BITS, int GQ>
__device__ __forceinline__ void score_int_row(const uint8_t* r, int group, const float (*qs)[kHeadDim],
                                              const float (*qsum)[kHeadDim / 32], int g, float* s) {
  constexpr int ub = layout::unit_bytes(BITS), words = ub / 4, mask = (1 << BITS) - 1;
  const uint16_t* params = reinterpret_cast<const uint16_t*>(r);
  const uint32_t* codes = reinterpret_cast<const uint32_t*>(r + layout::int_row_params_bytes(kHeadDim, group));
#pragma unroll
  for (int u = 0; u < kHeadDim / 32; ++u) {
    uint32_t w[words];
#pragma unroll
    for (int i = 0; i < words; ++i) w[i] = codes[u * words + i];
    const int gi = u * 32 / group;
    const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
    float acc[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) acc[h] = 0.f;
#pragma unroll
    for (int v = 0; v < 32; ++v) {
      const int jj = v % ub, k = v / ub;
      const float code = float((w[jj / 4] >> (8 * (jj % 4) + BITS * k)) & mask);
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) acc[h] = fmaf(qs[h][u * 32 + v], code, acc[h]);
    }
#pragma unroll
    for (int h = 0; h < GQ; ++h)
      if (h < g) s[h] = fmaf(scale, acc[h] - zero * qsum[h][u], s[h]);
  }
}

// The end of an attention block: merges its warps' online-softmax states (w_m, w_l: [W][g] max and sum, w_acc:
// [W][g][d] unnormalised outputs; -inf max = empty) and writes the block's partial of g heads to slot `part`
// of the launch's buffers. Call after __syncthreads(); every thread of the block takes part.
template <int W>
__device__ __forceinline__ void write_block_partial(const float (*w_m)[kMaxGroupHeads], const float (*w_l)[kMaxGroupHeads],
                                                    const float (*w_acc)[kMaxGroupHeads][kHeadDim], int g, int64_t part,
                                                    const AttentionLaunch& a) {
  for (int i = threadIdx.x; i < g * kHeadDim; i += blockDim.x) {
    const int h = i / kHeadDim, c = i % kHeadDim;
    float M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, w_m[w][h]);
    float L = 0.f, A = 0.f;
    if (M > -INFINITY)
      for (int w = 0; w < W; ++w) {
        if (!(w_m[w][h] > -INFINITY)) continue;
        const float e = expf(w_m[w][h] - M);
        L += w_l[w][h] * e;
        A += w_acc[w][h][c] * e;
      }
    a.part_acc[(part * g + h) * kHeadDim + c] = A;
    if (c == 0) {
      a.part_ml[(part * g + h) * 2] = M;
      a.part_ml[(part * g + h) * 2 + 1] = L;
    }
  }
}

}  // namespace kvq::cuda::dev
