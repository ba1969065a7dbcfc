// Decode-faithful attention over the GPU cache, one layer, every row of a step (decode: one row per sequence;
// prefill: one row per chunk token), in three launches:
//   1. prepare_queries: q <- (q · scale) R_K per (row, head)            (double accumulation, like the CPU)
//      (the rows of a launch are the step's, or those that AttentionLaunch::row_index names: the decode rows of a
//      step whose prefill chunks take the prefill kernel, prefill_attention.cu, which shares steps 1 and 3)
//   2. attention: grid (row, kv head, KV split); the view of the row's query at t, positions [0, t], split into
//      ranges of split_tokens positions; each position is a sink row, a quantized row or a recent row (view_row);
//      each K / V row is read ONCE for the whole GQA group (g query heads). Online softmax; writes the split's
//      unnormalised partial (m, l, acc) per head. The tensor-core kernel (decode_attention_mma.cu) takes the
//      caches it supports (int2 of one group, bf16), with the windows in n_win more slots of the same launch; this
//      CUDA-core kernel the others (int4, int8, KIVI). The reference twin (decode_attention_ref.cu) has this
//      kernel's grid and output and replaces it when asked.
//   3. merge: per (row, head) the exact log-sum-exp merge of the splits, then o <- o R_V^T, into the step row
//      (dev::merge_head, a warp per head). The tensor-core kernel does it in its launch: the last of a
//      (row, kv head)'s blocks to finish merges its g heads (AttentionLaunch::arrivals), which saves a launch a layer.
//
// The fast kernel: 4 warps, each takes tiles of 32 positions. Scores: lane = position (the lane decodes its K
// row against the group's queries in shared memory, broadcast reads, with the key codec's score: int2 / int4
// keys: per 32-value unit the codes' dot product Σ c q, then scale (Σ c q - zero Σ q), so scale and zero leave the
// inner loop; KIVI keys: the row of the position's key block decoded per channel, (code - zero_c) scale_c, then
// q · k; OScaR keys: the same with code · scale_c + zero_dequant_c, the score then times ν of the position;
// TurboQuant keys: centroids of the codes, q · c, times the row's n (/ ||c||)). Values: lane = 4 channels (the value
// codec's values4; at d = 256 8 channels, and lanes past d / 4 idle at d < 128), the tile's probabilities are broadcast
// by shuffles, each V row is read by the warp in one sweep. Every kernel is templated on the head dim D.
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"

namespace kvq::cuda {

int launch_attention_ref(const CacheGeometry& g, const AttentionLaunch& a, void* stream);  // decode_attention_ref.cu

namespace {

constexpr int kWarps = 4;

// Grid (launch row, query head), D threads: thread = channel; the query of step row row_index[row] (row when null).
template <int D>
__global__ void prepare_queries_kernel(const float* q, const int* row_index, int n_heads, int n_kv, int layer,
                                       float scale, const float* r_k, float* q_out) {
  const int row = blockIdx.x, j = blockIdx.y, c = threadIdx.x;
  const int64_t off = (int64_t(row) * n_heads + j) * D;
  const int in_row = row_index ? row_index[row] : row;
  const float x = __fmul_rn(q[(int64_t(in_row) * n_heads + j) * D + c], scale);
  if (!r_k) {
    q_out[off + c] = x;
    return;
  }
  __shared__ float xs[D];
  xs[c] = x;
  __syncthreads();
  const int g = n_heads / n_kv;
  const float* R = r_k + (int64_t(layer) * n_kv + j / g) * D * D;
  double acc = 0.0;
  for (int a = 0; a < D; ++a) acc = __dadd_rn(acc, __dmul_rn(double(xs[a]), double(R[a * D + c])));
  q_out[off + c] = float(acc);
}

using dev::warp_max, dev::warp_sum;

// K, V: the device codecs of the quantized region's keys and values of D values a row (the windows are WindowRows<D>).
// GQ: register arrays for GQ query heads; instances GQ = 1, 2, 4 (g == GQ, a compile-time constant) and
// GQ = kMaxGroupHeads (any g <= 8 at run time). Lane l takes the value channels 4 (l + 32 k), k < kVecs, that exist.
template <class K, class V, int D, int GQ>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(CacheGeometry geo, AttentionLaunch a) {
  constexpr int kVecs = (D / 4 + 31) / 32;  // 4-channel value chunks per lane
  constexpr bool kFull = D % 128 == 0;      // every lane holds kVecs chunks
  using W = WindowRows<D>;
  const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = GQ < kMaxGroupHeads ? GQ : a.n_heads / geo.n_kv;
  const RowDesc rd = a.rows[row];
  const int t = rd.pos, qe = quant_end(geo, t);
  const int first = split * a.split_tokens, end = min(t + 1, first + a.split_tokens);  // the split's positions
  const int begin = a.window > 0 ? max(first, t - a.window + 1) : first;  // a sliding window: (t - window, t]

  __shared__ float qs[kMaxGroupHeads][D];
  __shared__ float w_acc[kWarps][kMaxGroupHeads][D];
  __shared__ float w_m[kWarps][kMaxGroupHeads], w_l[kWarps][kMaxGroupHeads];
  __shared__ float qsum[kMaxGroupHeads][D / 32];  // Σ q over each 32-value unit (scale / zero folding)
  for (int i = threadIdx.x; i < g * D; i += blockDim.x)
    qs[i / D][i % D] = a.q_work[(int64_t(row) * a.n_heads + head * g) * D + i];
  __syncthreads();
  for (int i = threadIdx.x; i < g * (D / 32); i += blockDim.x) {
    float sum = 0.f;
    for (int v = 0; v < 32; ++v) sum += qs[i / (D / 32)][(i % (D / 32)) * 32 + v];
    qsum[i / (D / 32)][i % (D / 32)] = sum;
  }
  __syncthreads();

  float m[GQ], l[GQ], acc[GQ][4 * kVecs];
#pragma unroll
  for (int h = 0; h < GQ; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int i = 0; i < 4 * kVecs; ++i) acc[h][i] = 0.f;
  }
  const auto holds = [&](int k) { return kFull || lane + 32 * k < D / 4; };  // value chunk k of this lane exists

  for (int tile = begin + warp * 32; tile < end; tile += kWarps * 32) {
    const int p = tile + lane;
    const bool valid = p < end;
    float s[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) s[h] = 0.f;
    if (valid) {
      const dev::RowRef kr = dev::view_row<D>(geo, rd.seq, a.layer, 0, head, p, qe);
      if (!kr.quant) {
        W::template score<GQ>(kr.ptr, 0, D, qs, qsum, g, s);
      } else if constexpr (dev::ReadsCodebook<K>) {
        K::template score<GQ>(kr.ptr, geo.k_table, qs, g, s);
      } else {
        K::template score<GQ>(kr.ptr, kr.block_row, geo.k_group, qs, qsum, g, s);
        if constexpr (dev::token_scaled<K>()) {  // OScaR: ν_p · q·k̂
          const float nu = *dev::token_scales(geo, rd.seq, a.layer, p);
#pragma unroll
          for (int h = 0; h < GQ; ++h) s[h] *= nu;
        }
      }
    }
    float pr[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) {
      if (h >= g) continue;
      const float tmax = warp_max(valid ? s[h] : -INFINITY);  // finite: the tile holds >= 1 valid position
      const float m_new = fmaxf(m[h], tmax);
      const float corr = expf(m[h] - m_new);  // 0 on the first tile
      pr[h] = valid ? expf(s[h] - m_new) : 0.f;
      l[h] = l[h] * corr + warp_sum(pr[h]);
      m[h] = m_new;
#pragma unroll
      for (int i = 0; i < 4 * kVecs; ++i) acc[h][i] *= corr;
    }
    const int n_valid = min(32, end - tile);
#pragma unroll 8
    for (int j = 0; j < n_valid; ++j) {
      const dev::RowRef vr = dev::view_row<D>(geo, rd.seq, a.layer, 1, head, tile + j, qe);
      float v4[4 * kVecs];
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (!holds(k)) continue;
        if (vr.quant) V::values4(vr.ptr, 0, geo.v_group, 4 * (lane + 32 * k), v4 + 4 * k);
        else W::values4(vr.ptr, 0, D, 4 * (lane + 32 * k), v4 + 4 * k);
      }
#pragma unroll
      for (int h = 0; h < GQ; ++h) {
        if (h >= g) continue;
        const float pj = __shfl_sync(0xffffffffu, pr[h], j);
#pragma unroll
        for (int k = 0; k < kVecs; ++k) {
          if (!holds(k)) continue;
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[h][4 * k + i] = fmaf(pj, v4[4 * k + i], acc[h][4 * k + i]);
        }
      }
    }
  }

  // Merge the warps' states, then write this split's partial per head.
#pragma unroll
  for (int h = 0; h < GQ; ++h) {
    if (h >= g) continue;
    if (lane == 0) w_m[warp][h] = m[h], w_l[warp][h] = l[h];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!holds(k)) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) w_acc[warp][h][4 * (lane + 32 * k) + i] = acc[h][4 * k + i];
    }
  }
  __syncthreads();
  const int64_t part = (int64_t(row) * geo.n_kv + head) * a.n_slots + split;
  dev::write_block_partial<kWarps, D>(w_m, w_l, w_acc, g, part, a);
}

// The CUDA-core kernel instance of codecs K, V at head dim D for a GQA group of gq query heads (kEvery: the row's
// per-g instances are compiled at this D, gpu_every_gqa).
using CudaCoreKernel = void (*)(CacheGeometry, AttentionLaunch);
template <class K, class V, int D, bool kEvery>
CudaCoreKernel gqa_instance(int gq) {
  if constexpr (!kEvery) {
    return attention_kernel<K, V, D, kMaxGroupHeads>;
  } else {
    switch (gq) {
      case 1: return attention_kernel<K, V, D, 1>;
      case 2: return attention_kernel<K, V, D, 2>;
      case 4: return attention_kernel<K, V, D, 4>;
      default: return attention_kernel<K, V, D, kMaxGroupHeads>;
    }
  }
}
// The CUDA-core kernel of the cache's instance row at its head dim (null for a tensor-core row or no row).
CudaCoreKernel cuda_core_kernel(const CacheGeometry& geo, int gq) {
  CudaCoreKernel k = nullptr;
  with_instance(geo.instance, geo.head_dim, [&](auto row, auto dim) {
    constexpr int I = decltype(row)::value, D = decltype(dim)::value;
    constexpr GpuInstance r = kGpuInstances[I];
    if constexpr (r.path == GpuPath::kCudaCore)
      k = gqa_instance<RowKeys<I, D>, RowValues<I, D>, D, gpu_every_gqa(r, D)>(gq);
  });
  return k;
}

// Block (row, query heads 4y .. 4y + 3), a warp per head: dev::merge_head.
constexpr int kMergeWarps = 4;
template <int D>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(AttentionLaunch a, int n_kv, const float* r_v,
                                                                 float* out) {
  __shared__ float o[kMergeWarps][D];
  const int warp = threadIdx.x >> 5, j = blockIdx.y * kMergeWarps + warp;
  if (j < a.n_heads) dev::merge_head<D>(a, n_kv, blockIdx.x, j, r_v, out, o[warp]);
}

}  // namespace

int launch_prepare_queries(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, const float* d_q,
                           void* stream) {
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto, auto dim) {
    constexpr int D = decltype(dim)::value;
    prepare_queries_kernel<D><<<dim3(unsigned(a.n_rows), unsigned(a.n_heads)), D, 0,
                                static_cast<cudaStream_t>(stream)>>>(d_q, a.row_index, a.n_heads, g.n_kv, a.layer,
                                                                     a.scale, t.r_k, a.q_work);
    e = cudaGetLastError();
  });
  return e;
}

int launch_merge_partials(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, float* d_out,
                          void* stream) {
  const dim3 grid(unsigned(a.n_rows), unsigned((a.n_heads + kMergeWarps - 1) / kMergeWarps));
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto, auto dim) {
    merge_kernel<decltype(dim)::value><<<grid, kMergeWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        a, g.n_kv, t.r_v, d_out);
    e = cudaGetLastError();
  });
  return e;
}

int launch_attention(const CacheGeometry& g, const AttentionLaunch& a_in, const TransformPtrs& t, const float* d_q,
                     float* d_out, bool reference, void* stream) {
  if (a_in.n_rows <= 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool mma = !reference && attention_mma_supported(g);
  AttentionLaunch a = a_in;
  a.n_slots = a.n_splits + (mma ? a.n_win : 0);
  const bool fused_merge = mma && a.arrivals;  // the tensor-core kernel's last block of each (row, kv head) merges
  if (fused_merge) a.r_v = t.r_v, a.out = d_out;
  else a.arrivals = nullptr;
  int e = launch_prepare_queries(g, a, t, d_q, stream);
  if (e != cudaSuccess) return e;
  if (reference) {
    e = launch_attention_ref(g, a, stream);
  } else if (mma) {  // the quantized region's splits and, in n_win more slots, the windows, on tensor cores
    e = launch_attention_mma(g, a, stream);
  } else {
    const CudaCoreKernel kernel = cuda_core_kernel(g, a.n_heads / g.n_kv);
    if (!kernel) return cudaErrorInvalidValue;  // no instance row: refused on the host (gpu_instances.h)
    kernel<<<dim3(unsigned(a.n_rows), unsigned(g.n_kv), unsigned(a.n_splits)), kWarps * 32, 0, st>>>(g, a);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess || fused_merge) return e;
  return launch_merge_partials(g, a, t, d_out, stream);
}

int attention_blocks_per_sm(const CacheGeometry& g, int n_heads, int* blocks) {
  if (attention_mma_supported(g)) return attention_mma_blocks_per_sm(g, n_heads, blocks);
  const CudaCoreKernel kernel = cuda_core_kernel(g, n_heads / g.n_kv);
  if (!kernel) return cudaErrorInvalidValue;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kWarps * 32, 0);
}

}  // namespace kvq::cuda
