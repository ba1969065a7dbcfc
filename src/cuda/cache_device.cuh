// Device-side helpers shared by the cache kernels: the decode-faithful view's rows (sink, page, ring; KIVI key
// blocks), the block partials of the attention kernels, and the interface of the device codecs (the decoding and
// encoding of stored rows, one file per codec: codecs.cuh). fp16 / bf16 conversions are common/half.h's, shared
// with the host.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "codecs/codec_id.h"
#include "codecs/layout.h"
#include "common/half.h"
#include "cuda/gpu_kernels.h"

namespace kvq::cuda::dev {

// --- The decode-faithful view of a query at position t: cuda::quant_end (gpu_kernels.h), block_tokens B. D: the head
// dim g.head_dim, a template parameter of every kernel (the instance of gpu_instances.h that with_instance chose).

// The windows of slot seq, in the pool's pages: sink rows, then the ring, rows of g.window_row bytes (bf16 rows of D
// values, or int8 IntRows; gpu_kernels.h), then with int8 windows the ring slots' body rows.
__device__ __forceinline__ uint8_t* windows_of(const CacheGeometry& g, int seq) { return g.pool + g.window_base[seq]; }
__device__ __forceinline__ uint8_t* sink_row(const CacheGeometry& g, int seq, int layer, int kv, int head, int pos) {
  return windows_of(g, seq) + (((int64_t(layer) * 2 + kv) * g.n_kv + head) * g.sink + pos) * g.window_row;
}
__device__ __forceinline__ uint8_t* ring_row(const CacheGeometry& g, int seq, int layer, int kv, int head, int pos) {
  const int64_t sinks = int64_t(g.n_layers) * 2 * g.n_kv * g.sink;
  return windows_of(g, seq) +
         (sinks + ((int64_t(layer) * 2 + kv) * g.n_kv + head) * g.ring_tokens + pos % g.ring_tokens) * g.window_row;
}
// int8 windows (g.ring_body > 0): the body row of (layer, K / V, head) of position pos that its ring slot keeps, at the
// row's place in a page of one token (KvCache::ring_body_row's arithmetic).
__device__ __forceinline__ uint8_t* ring_body_row(const CacheGeometry& g, int seq, int layer, int kv, int head,
                                                  int pos) {
  const int64_t window_rows = int64_t(g.n_layers) * 2 * g.n_kv * (g.sink + g.ring_tokens);
  const int64_t in_slot = (g.layer_offset + head * g.head_bytes + (kv ? g.k_region : 0)) / g.page_tokens;
  return windows_of(g, seq) + window_rows * g.window_row + int64_t(pos % g.ring_tokens) * g.ring_body + in_slot;
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

// Where row `pos` of the view of a query at t lives: a window row (sink / recent: bf16, or int8 for KV4-RL), a codec
// row (quantized), or for KIVI keys in the quantized region the key block and the row within it.
struct RowRef {
  const void* ptr;  // window row, codec row, or layout::KiviKeyBlock
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

// Shared memory of the warp that demotes one row of D values (kv_append.cu, the codecs' encode_row): the row as
// floats, its codes one per byte, its groups' (scale, zero) fp16 bits, the clip threshold.
template <int D>
struct RowScratch {
  float x[D];
  uint8_t codes[D];
  uint16_t params[2 * (D / 32)];
  float thr;
};

// The device type of a codec's blocks of rows of D values, specialised by each codec file (codec_bf16.cuh,
// codec_int.cuh, codec_kivi.cuh, ...; codecs.cuh includes them all): a struct template on D of static __device__
// functions,
//   kKeyBlocks                          false: per-token rows; true: per-channel key blocks of G tokens (KIVI)
//   value(p, row, group, c)             value c of a stored row (key blocks: of row `row` of the block)
//   values4(p, row, group, c0, out)     values c0 .. c0 + 3, c0 a multiple of 4
//   score<GQ>(p, row, group, qs, qsum, g, s)   s[h] += q_h · k for the g <= GQ queries qs (qsum: Σ q per 32 values)
//   encode_row(src, dst, group, clip_index, RowScratch<D>&)   rows: a warp demotes one bf16 ring row into dst
//   encode_block(...)                   key blocks: a block of D threads demotes G ring rows (codec_kivi.cuh)
//   kMaxBlockTokens (key blocks)        most tokens of one key block (the demotion's shared rows)
//   kTileBytes, fetch_tile, KeyTile     key blocks: a decoded tile's copy of what its rows read (cuda/key_tile.cuh)
//   kTokenScaled (optional, key blocks) true: keys stored divided by ν, which multiplies their scores (codec_oscar.cuh)
//   kTensorScaled (optional, rows)      true: rows stored as x / s with the layer's per-tensor scale s
//                                       (CacheGeometry::k_scale / v_scale), demoted by encode_row_scaled(src, dst, s);
//                                       the kernels multiply what value / values4 / score give by s (codec_fp8.cuh)
//   kHadamardRows (optional, rows)      true: value / values4 give the row in a Hadamard domain; the row's values go
//                                       back together through finish_lanes (a row of 128 over L lanes: keys over 4,
//                                       values over the warp) or finish_channel (a block of D threads); rope_lanes and
//                                       finish_channel re-apply RoPE to keys stored without it (kPreRope:
//                                       CacheGeometry::k_rope's angles of the position);
//                                       demoted by encode_row_at(src, dst, angles, RowScratch<D>&) (codec_nexus.cuh)
// DeviceCodecOf<id>::type<D> is the codec's key blocks or rows; ::values<D>, when present, its value rows (OScaR's
// are their own type; KIVI's value specs run under int rows, gpu_instances.h).
template <CodecId id>
struct DeviceCodecOf;

// Whether device codec C stores token-scaled keys (C::kTokenScaled, false when C does not say).
template <class C>
constexpr bool token_scaled() {
  return requires { requires C::kTokenScaled; };
}

// s[h] += q_h · k̂ for the g <= GQ queries qs[h][:], the row decoded 4 channels at a time by C::values4: the scores of
// a codec without a shortcut of its own (KIVI's, OScaR's and Kitty's key blocks, int8 rows).
template <class C, int D, int GQ>
__device__ __forceinline__ void score_by_values4(const void* p, int row, int group, const float (*qs)[D], int g,
                                                 float* s) {
  for (int c0 = 0; c0 < D; c0 += 4) {
    float k4[4];
    C::values4(p, row, group, c0, k4);
#pragma unroll
    for (int h = 0; h < GQ; ++h)
      if (h < g)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[h] = fmaf(qs[h][c0 + i], k4[i], s[h]);
  }
}

// Whether device codec C stores its rows in a Hadamard domain (C::kHadamardRows: NexusQuant's), and whether its keys
// are stored without RoPE (C::kPreRope); false when C does not say.
template <class C>
constexpr bool hadamard_rows() {
  return requires { requires C::kHadamardRows; };
}
template <class C>
constexpr bool pre_rope() {
  return requires { requires C::kPreRope; };
}
// The angles (cos d/2 | sin d/2) of position pos for keys stored without RoPE (C::kPreRope), else null.
template <class C, int D>
__device__ __forceinline__ const float* rope_angles_of(const CacheGeometry& g, int pos) {
  if constexpr (pre_rope<C>()) {
    return g.k_rope + int64_t(pos) * D;
  } else {
    return nullptr;
  }
}

// Whether device codec C takes the layer's per-tensor scale s (C::kTensorScaled: vLLM's FP8 rows; CacheGeometry::k_scale
// / v_scale): its rows are encoded from x / s (C::encode_row_scaled) and the kernels multiply what it decodes by s;
// false when C does not say.
template <class C>
constexpr bool tensor_scaled() {
  return requires { requires C::kTensorScaled; };
}

// A key codec that decodes with a table of each (layer, kv head) (KvCodec::device_table, uploaded as
// CacheGeometry::k_table: TurboQuant's codebook, PN-Mix's width map) names its type, C::Table, and the bytes of one
// head's, C::kTableBytes; its value, values4, score and encode_row take the head's table (key_table) in place of the
// group and clip arguments. TurboQuant's keys are a codebook besides (C::kCodebook: the decoded tiles' pass of
// their own, decode_attention_mma.cu).
template <class C>
concept ReadsTable = requires { typename C::Table; requires C::kTableBytes > 0; };
template <class C>
concept ReadsCodebook = ReadsTable<C> && requires { requires C::kCodebook; };
// The table of kv head `head` of g's layer.
template <ReadsTable C>
__device__ __forceinline__ const typename C::Table* key_table(const CacheGeometry& g, int head) {
  return reinterpret_cast<const typename C::Table*>(static_cast<const uint8_t*>(g.k_table) +
                                                    int64_t(head) * C::kTableBytes);
}

// The end of an attention block: merges its warps' online-softmax states (w_m, w_l: [W][g] max and sum, w_acc:
// [W][g][D] unnormalised outputs; -inf max = empty) and writes the block's partial of g heads to slot `part`
// of the launch's buffers. Call after __syncthreads(); every thread of the block takes part.
template <int W, int D>
__device__ __forceinline__ void write_block_partial(const float (*w_m)[kMaxGroupHeads], const float (*w_l)[kMaxGroupHeads],
                                                    const float (*w_acc)[kMaxGroupHeads][D], int g, int64_t part,
                                                    const AttentionLaunch& a) {
  for (int i = threadIdx.x; i < g * D; i += blockDim.x) {
    const int h = i / D, c = i % D;
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
    a.part_acc[(part * g + h) * D + c] = A;
    if (c == 0) {
      a.part_ml[(part * g + h) * 2] = M;
      a.part_ml[(part * g + h) * 2 + 1] = L;
    }
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out[row_index[row]][j] <- (the exact log-sum-exp merge of the n_slots partials of launch row `row`, query head j)
// R_V^T (r_vt null: no transform), by one warp: lane i takes channels 4i .. 4i + 3, and 4(i + 32) .. for D = 256 (lanes
// past D / 4 take none for D < 128). The slots' (max, sum) pairs are read 32 at a time (a slot per lane) and their
// weights exp(m_s - M) broadcast by shuffles; each lane sums its channels over the slots in slot order, 8 slots' loads
// in flight (every slot is written, an empty one as m = -inf, acc = 0). The partials are read past L1 (__ldcg): in a
// fused merge other blocks wrote them. o: D floats of shared memory of the warp (for R_V).
template <int D>
__device__ __forceinline__ void merge_head(const AttentionLaunch& a, int n_kv, int row, int j, const float* r_vt,
                                           float* out, float* o) {
  static_assert(D % 4 == 0, "channels in fours");
  constexpr int kChunks = (D / 4 + 31) / 32;  // 4-channel chunks per lane: lane + 32 k
  constexpr bool kFull = D % 128 == 0;         // every lane holds kChunks chunks
  const int lane = threadIdx.x & 31;
  const auto holds = [&](int k) { return kFull || lane + 32 * k < D / 4; };
  const int g = a.n_heads / n_kv, head = j / g, h = j % g;
  const int64_t part0 = (int64_t(row) * n_kv + head) * a.n_slots;
  const float* ml = a.part_ml + (part0 * g + h) * 2;             // slot s: ml[s * g * 2 + {0, 1}]
  const float* acc = a.part_acc + (part0 * g + h) * D + 4 * lane;  // slot s: acc[s * g * D], chunk k: + 128 k
  float M = -INFINITY;
  for (int s = lane; s < a.n_slots; s += 32) M = fmaxf(M, __ldcg(ml + int64_t(s) * g * 2));
  M = warp_max(M);  // finite: every view holds position t itself
  float L = 0.f;
  float4 A[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) A[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < a.n_slots; s0 += 32) {
    const int s = s0 + lane;
    float e = 0.f;
    if (s < a.n_slots) {
      const float ms = __ldcg(ml + int64_t(s) * g * 2);
      if (ms > -INFINITY) e = expf(ms - M), L += __ldcg(ml + int64_t(s) * g * 2 + 1) * e;
    }
    const int n = min(32, a.n_slots - s0);
#pragma unroll 8
    for (int i = 0; i < n; ++i) {
      const float w = __shfl_sync(0xffffffffu, e, i);
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        if (!holds(k)) continue;
        const float4 x = __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s0 + i) * g * D + 128 * k));
        A[k].x = fmaf(x.x, w, A[k].x), A[k].y = fmaf(x.y, w, A[k].y), A[k].z = fmaf(x.z, w, A[k].z),
        A[k].w = fmaf(x.w, w, A[k].w);
      }
    }
  }
  L = warp_sum(L);  // > 0: every view holds position t itself
  const int64_t off = (int64_t(a.row_index ? a.row_index[row] : row) * a.n_heads + j) * D;
  float4 r[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) r[k] = make_float4(A[k].x / L, A[k].y / L, A[k].z / L, A[k].w / L);
  if (!r_vt) {  // (out is only 4-byte aligned in general)
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (!holds(k)) continue;
      float* dst = out + off + 4 * lane + 128 * k;
      dst[0] = r[k].x, dst[1] = r[k].y, dst[2] = r[k].z, dst[3] = r[k].w;
    }
    return;
  }
  __syncwarp();  // o[] may still be read by the warp's previous head
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    if (!holds(k)) continue;
    float* dst = o + 4 * lane + 128 * k;
    dst[0] = r[k].x, dst[1] = r[k].y, dst[2] = r[k].z, dst[3] = r[k].w;
  }
  __syncwarp();
  // o R_V^T: out[b] = Σ_x o[x] R_V[b][x], double accumulation in x order as kv/transform.cpp; lane takes b = lane + 32k
  // and reads R_V[b][x] as R_V^T[x][b], so that the warp's loads of one x are one run.
  const float* RT = r_vt + (int64_t(a.layer) * n_kv + head) * D * D;
#pragma unroll
  for (int k = 0; k < (D + 31) / 32; ++k) {
    const int b = lane + 32 * k;
    if (D % 32 != 0 && b >= D) continue;
    double sum = 0.0;
#pragma unroll 8
    for (int x = 0; x < D; ++x) sum = __dadd_rn(sum, __dmul_rn(double(o[x]), double(RT[int64_t(x) * D + b])));
    out[off + b] = float(sum);
  }
}

// The end of a block of a launch with the merge fused in (a.arrivals): counts the block's arrival at its
// (row, kv head); in the last of the a.n_slots blocks to arrive, warp w merges query heads w, w + W, ... of the g
// (merge_head, into a.out) and the count is reset to zero for the next launch. The others return. Call after
// write_block_partial, with every thread of the block (W warps); scratch: W · D floats of shared memory that the
// block no longer reads.
template <int W, int D>
__device__ __forceinline__ void merge_if_last(const AttentionLaunch& a, int n_kv, int row, int head, float* scratch) {
  int* arrived = a.arrivals + int64_t(row) * n_kv + head;
  __threadfence();  // this thread's part of the partial is visible to every block before the arrival is counted
  __syncthreads();
  // The flag is the barrier's predicate, not a shared variable. On the H200 a first version with 1 KB of shared memory
  // of its own left the bf16 instance one block per SM instead of two (641 against 505 us at 8 x 64K), and one with a
  // 16-byte flag still ran 586 us.
  if (!__syncthreads_or(threadIdx.x == 0 && atomicAdd(arrived, 1) == a.n_slots - 1)) return;
  __threadfence();  // every other block's partial, counted before this one's arrival, is read after it
  const int g = a.n_heads / n_kv, warp = threadIdx.x >> 5;
  for (int h = warp; h < g; h += W) merge_head<D>(a, n_kv, row, head * g + h, a.r_vt, a.out, scratch + warp * D);
  if (threadIdx.x == 0) *arrived = 0;  // every block of this (row, kv head) has arrived
}

}  // namespace kvq::cuda::dev
