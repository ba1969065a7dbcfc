// Device-side helpers shared by the cache kernels: the decode-faithful view's rows (sink, page, ring; KIVI key
// blocks), the block partials of the attention kernels, and the interface of the device codecs (the decoding and
// encoding of stored rows, one file per codec: codecs.cuh). fp16 / bf16 conversions are common/half.h's, shared
// with the host.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/half.h"
#include "cuda/gpu_kernels.h"
#include "kv/codec_id.h"
#include "kv/layout.h"

namespace kvq::cuda::dev {

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
// The (layer, head) part of pool page `page`: { K blocks | V rows }; g is the geometry of `layer` (its layer_offset).
__device__ __forceinline__ uint8_t* page_head_at(const CacheGeometry& g, int page, int layer, int head) {
  (void)layer;
  return g.pool + int64_t(page) * g.page_bytes + g.layer_offset + int64_t(head) * g.head_bytes;
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

// Token-scaled keys: ν of quantized positions pos, pos + 1, ... (within pos's page) of `layer` (kv/cache_layout.h).
__device__ __forceinline__ float* token_scales(const CacheGeometry& g, int seq, int layer, int pos) {
  const int q = pos - g.sink;
  const int page = g.page_table[int64_t(seq) * g.pages_per_seq + q / g.page_tokens];
  return reinterpret_cast<float*>(g.pool + int64_t(page) * g.page_bytes + g.scale_base + layer * g.scale_region) +
         q % g.page_tokens;
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

// Shared memory of the warp that demotes one row (kv_append.cu, the codecs' encode_row): the row as floats, its
// codes one per byte, its groups' (scale, zero) fp16 bits, the clip threshold.
struct RowScratch {
  float x[kHeadDim];
  uint8_t codes[kHeadDim];
  uint16_t params[2 * (kHeadDim / 32)];
  float thr;
};

// The device type of a codec's blocks, specialised by each codec file (codec_bf16.cuh, codec_int.cuh,
// codec_kivi.cuh; codecs.cuh includes them all): a struct of static __device__ functions,
//   kKeyBlocks                          false: per-token rows; true: per-channel key blocks of G tokens (KIVI)
//   value(p, row, group, c)             value c of a stored row (key blocks: of row `row` of the block)
//   values4(p, row, group, c0, out)     values c0 .. c0 + 3, c0 a multiple of 4
//   score<GQ>(p, row, group, qs, qsum, g, s)   s[h] += q_h · k for the g <= GQ queries qs (qsum: Σ q per 32 values)
//   encode_row(src, dst, group, clip_index, RowScratch&)   rows: a warp demotes one bf16 ring row into dst
//   encode_block(...)                   key blocks: a block of kHeadDim threads demotes G ring rows (codec_kivi.cuh)
//   kTokenScaled (optional, key blocks) true: keys stored divided by ν, which multiplies their scores (codec_oscar.cuh)
// DeviceCodecOf<id>::type is the codec's key blocks or rows; ::values, when present, its value rows (OScaR's are
// their own type; KIVI's value specs run under int rows, gpu_instances.h).
template <CodecId id>
struct DeviceCodecOf;

// Whether device codec C stores token-scaled keys (C::kTokenScaled, false when C does not say).
template <class C>
constexpr bool token_scaled() {
  if constexpr (requires { C::kTokenScaled; }) {
    return C::kTokenScaled;
  } else {
    return false;
  }
}

// A key codec that reads the cache's TurboQuant codebook (codec_turboquant.cuh) says kCodebook = true; its value, score
// and encode_row take CacheGeometry::k_codebook in place of the group (and clip) arguments.
template <class C>
concept ReadsCodebook = requires { requires C::kCodebook; };

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
