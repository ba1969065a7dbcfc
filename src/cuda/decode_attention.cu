// Decode-faithful attention over the GPU cache, one layer, every row of a step (decode: one row per sequence;
// prefill: one row per chunk token), in three launches:
//   1. prepare_queries: q <- (q · scale) R_K per (row, kv head: its g query heads)   (cuda/rotate.cuh: as the CPU)
//      (the rows of a launch are the step's, or those that AttentionLaunch::row_index names: the decode rows of a
//      step whose prefill chunks take the prefill kernel, prefill_attention.cu, which shares steps 1 and 3)
//   2. attention: grid (row, kv head, KV split); the view of the row's query at t, positions [0, t], split into
//      ranges of split_tokens positions; each position is a sink row, a quantized row or a recent row (view_row);
//      each K / V row is read ONCE for the whole GQA group (g query heads). Online softmax; writes the split's
//      unnormalised partial (m, l, acc) per head. The tensor-core kernel (decode_attention_mma.cu) takes the
//      caches it supports (int2 of one group, bf16), with the windows in n_win more slots of the same launch; the
//      CUDA-core kernel the others (int4, int8, KIVI, OScaR, TurboQuant, llama.cpp's blocks; attention_cuda_core.cuh,
//      its instances compiled in kCudaCoreShards files). The reference twin (decode_attention_ref.cu) has that
//      kernel's grid and output and replaces it when asked.
//   3. merge: per (row, head) the exact log-sum-exp merge of the splits, then o <- o R_V^T, into the step row
//      (dev::merge_head, a warp per head). The tensor-core kernel does it in its launch: the last of a
//      (row, kv head)'s blocks to finish merges its g heads (AttentionLaunch::arrivals), which saves a launch a layer.
//
// The CUDA-core kernel: 4 warps, each takes tiles of 32 positions. Scores: lane = position (the lane decodes its K
// row against the group's queries in shared memory, broadcast reads, with the key codec's score: int2 / int4
// keys: per 32-value unit the codes' dot product Σ c q, then scale (Σ c q - zero Σ q), so scale and zero leave the
// inner loop; KIVI keys: the row of the position's key block decoded per channel, (code - zero_c) scale_c, then
// q · k; OScaR keys: the same with code · scale_c + zero_dequant_c, the score then times ν of the position;
// TurboQuant keys: centroids of the codes, q · c, times the row's n (/ ||c||)). Values: lane = 4 channels (the value
// codec's values4; at d = 256 8 channels, and lanes past d / 4 idle at d < 128), the tile's probabilities are broadcast
// by shuffles, each V row is read by the warp in one sweep. Every kernel is templated on the head dim D.
#include <cuda_runtime.h>

#include <array>
#include <utility>

#include "cuda/attention_cuda_core.h"
#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"
#include "cuda/rotate.cuh"

namespace kvq::cuda {

int launch_attention_ref(const CacheGeometry& g, const AttentionLaunch& a, void* stream);  // decode_attention_ref.cu

namespace {

// Grid (launch row, kv head), D threads: thread = channel; the queries of the kv head's g query heads in step row
// row_index[row] (row when null), kQueryPass heads a pass, so that each element of R_K is read once for them.
constexpr int kQueryPass = 4;
template <int D>
__global__ void prepare_queries_kernel(const float* q, const int* row_index, int n_heads, int n_kv, int layer,
                                       float scale, TransformPtrs t, float* q_out) {
  const int row = blockIdx.x, head = blockIdx.y, c = threadIdx.x, g = n_heads / n_kv;
  const int in_row = row_index ? row_index[row] : row;
  const float* R = t.r_k ? t.r_k + (int64_t(layer) * n_kv + head) * D * D : nullptr;
  __shared__ double scratch[kQueryPass][D];
  for (int j0 = head * g; j0 < (head + 1) * g; j0 += kQueryPass) {
    const int n = min(kQueryPass, (head + 1) * g - j0);
    float x[kQueryPass];
#pragma unroll
    for (int i = 0; i < kQueryPass; ++i)
      x[i] = i < n ? __fmul_rn(q[(int64_t(in_row) * n_heads + j0 + i) * D + c], scale) : 0.f;
    if (R) dev::rotate_rows<D>(x, R, t.k_hadamard, scratch);
#pragma unroll
    for (int i = 0; i < kQueryPass; ++i)
      if (i < n) q_out[(int64_t(row) * n_heads + j0 + i) * D + c] = x[i];
  }
}

// The shards' instances, one function each; the pair's shard answers (attention_cuda_core.h).
template <int... S>
constexpr auto shard_table(std::integer_sequence<int, S...>) {
  return std::array<CudaCoreKernel (*)(const CacheGeometry&, int), sizeof...(S)>{&cuda_core_kernel_in_shard<S>...};
}
constexpr auto kShards = shard_table(std::make_integer_sequence<int, kCudaCoreShards>());

// Block (row, query heads 4y .. 4y + 3), a warp per head: dev::merge_head.
constexpr int kMergeWarps = 4;
template <int D>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(AttentionLaunch a, int n_kv, const float* r_vt,
                                                                 float* out) {
  __shared__ float o[kMergeWarps][D];
  const int warp = threadIdx.x >> 5, j = blockIdx.y * kMergeWarps + warp;
  if (j < a.n_heads) dev::merge_head<D>(a, n_kv, blockIdx.x, j, r_vt, out, o[warp]);
}

}  // namespace

CudaCoreKernel cuda_core_kernel(const CacheGeometry& g, int gq) {
  if (g.instance < 0 || g.instance >= kGpuInstanceCount || !head_dim_bit(g.head_dim)) return nullptr;
  return kShards[cuda_core_shard(g.instance, g.head_dim)](g, gq);
}

int launch_prepare_queries(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, const float* d_q,
                           void* stream) {
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto, auto dim) {
    constexpr int D = decltype(dim)::value;
    prepare_queries_kernel<D><<<dim3(unsigned(a.n_rows), unsigned(g.n_kv)), D, 0,
                                static_cast<cudaStream_t>(stream)>>>(d_q, a.row_index, a.n_heads, g.n_kv, a.layer,
                                                                     a.scale, t, a.q_work);
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
        a, g.n_kv, t.r_vt, d_out);
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
  if (fused_merge) a.r_vt = t.r_vt, a.out = d_out;
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
    kernel<<<dim3(unsigned(a.n_rows), unsigned(g.n_kv), unsigned(a.n_splits)), kCudaCoreWarps * 32, 0, st>>>(g, a);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess || fused_merge) return e;
  return launch_merge_partials(g, a, t, d_out, stream);
}

int attention_blocks_per_sm(const CacheGeometry& g, int n_heads, int* blocks) {
  if (attention_mma_supported(g)) return attention_mma_blocks_per_sm(g, n_heads, blocks);
  const CudaCoreKernel kernel = cuda_core_kernel(g, n_heads / g.n_kv);
  if (!kernel) return cudaErrorInvalidValue;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kCudaCoreWarps * 32, 0);
}

}  // namespace kvq::cuda
