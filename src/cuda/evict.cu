// The evict prompt policy on the GPU cache (kv/evict.h; cuda/gpu_cache.h says when it runs), once at the end of a
// sequence's prompt of P tokens, one launch of each kernel per layer:
//   scores:  grid (kv head, observed query: the last min(P, kEvictObserve) prompt queries), kScoreThreads threads:
//            for each query head of the kv head's group, the softmax p over the prompt rows t <= the query's
//            position, its output o = Σ p_t v_t, and the term p_t ⟨v_t, o⟩ / ‖o‖ of score_t; then a second kernel
//            sums the queries' terms in query order. The CPU's evict_scores: dot products in float (here a warp's
//            lanes over the channels, then a shuffle sum), the softmax and the score sums in double, a zero output
//            skipped; over the bf16 rows the view of a query at P - 1 reads (sinks, pages, ring: an evict cache
//            stores bf16 everywhere). Deterministic: row t is always warp t % 8's. A block per (kv head, query),
//            not per kv head: a warp's rows are a chain of dependent loads (block table, row), so the blocks in
//            flight set the speed.
//   compact: grid (slot, kv head, K/V), one thread per channel: the row of kept position keep[slot] -> a staging row;
//            then, a second launch, the staging row -> where the view of a query at slot kept - 1 reads the slot.
//            Staging first: a slot's place (its ring row, modulo the ring) may hold a kept row not yet moved.
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"
#include "kv/evict.h"

namespace kvq::cuda {

namespace {

constexpr int kScoreThreads = 256, kScoreWarps = kScoreThreads / 32;

// The bf16 row of position pos as the view of a query whose quantized region ends at qe reads it.
template <int D>
__device__ __forceinline__ const uint16_t* evict_row(const CacheGeometry& g, int seq, int layer, int kv, int head,
                                                     int pos, int qe) {
  return static_cast<const uint16_t*>(dev::view_row(g, seq, layer, kv, head, pos, qe).ptr);
}

// x reduced over the block with op (every thread gets the result); sh: kScoreWarps doubles of shared memory.
template <class Op>
__device__ double block_reduce(double x, Op op, double* sh) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();  // sh is free (its last readers are past this)
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = x;
  __syncthreads();
  x = sh[0];
  for (int w = 1; w < kScoreWarps; ++w) x = op(x, sh[w]);
  return x;
}

// Σ_c a[c] b_row[c] over the warp's lanes (lane takes c = lane + 32 i), in float, every lane gets it.
template <int D>
__device__ __forceinline__ float warp_dot(const float* a, const uint16_t* row) {
  float s = 0.f;
  for (int c = threadIdx.x % 32; c < D; c += 32) s += a[c] * bf16_to_f32(row[c]);
  return dev::warp_sum(s);
}

// Block (kv head, observed query i): the terms of query i's heads of the group, summed over them into part[i][head][t]
// (evict_sum_kernel adds the queries' parts in query order). p: [n_q][n_kv][P] scratch.
template <int D>
__global__ void __launch_bounds__(kScoreThreads)
    evict_scores_kernel(CacheGeometry g, int layer, int seq, int P, const float* obs, int n_heads, float scale,
                        double* p_all, double* part_all) {
  const int head = blockIdx.x, i = blockIdx.y, group = n_heads / g.n_kv, n_q = gridDim.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qe = quant_end(g, P - 1);
  const int64_t at = (int64_t(i) * g.n_kv + head) * P;
  double* p = p_all + at;
  double* part = part_all + at;
  constexpr int kLaneChannels = (D + 31) / 32;
  __shared__ float q[D], o[D];
  __shared__ float warp_o[kScoreWarps][D];
  __shared__ double red[kScoreWarps];
  const int pos = P - n_q + i, n = pos + 1;
  for (int t = threadIdx.x; t < P; t += kScoreThreads) part[t] = 0.0;
  for (int j = 0; j < group; ++j) {
    __syncthreads();  // q, o and p of the previous head are read
    const float* src = obs + (int64_t(pos % kEvictObserve) * n_heads + head * group + j) * D;
    for (int c = threadIdx.x; c < D; c += kScoreThreads) q[c] = src[c] * scale;
    __syncthreads();
    double mx = -INFINITY;
    for (int t = warp; t < n; t += kScoreWarps) {
      const float s = warp_dot<D>(q, evict_row<D>(g, seq, layer, 0, head, t, qe));
      if (lane == 0) p[t] = double(s);
      mx = fmax(mx, double(s));
    }
    mx = block_reduce(mx, [](double a, double b) { return fmax(a, b); }, red);
    double sum = 0.0;
    for (int t = threadIdx.x; t < n; t += kScoreThreads) sum += (p[t] = exp(p[t] - mx));
    sum = block_reduce(sum, [](double a, double b) { return a + b; }, red);
    for (int t = threadIdx.x; t < n; t += kScoreThreads) p[t] /= sum;
    __syncthreads();
    // o = Σ_t float(p_t) v_t: each warp over its rows, lane over its channels; then the warps' parts summed
    float acc[kLaneChannels] = {};
    for (int t = warp; t < n; t += kScoreWarps) {
      const float pt = float(p[t]);
      const uint16_t* v = evict_row<D>(g, seq, layer, 1, head, t, qe);
#pragma unroll
      for (int k = 0; k < kLaneChannels; ++k)
        if (lane + 32 * k < D) acc[k] += pt * bf16_to_f32(v[lane + 32 * k]);
    }
#pragma unroll
    for (int k = 0; k < kLaneChannels; ++k)
      if (lane + 32 * k < D) warp_o[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    double sq = 0.0;
    for (int c = threadIdx.x; c < D; c += kScoreThreads) {
      float s = 0.f;
      for (int w = 0; w < kScoreWarps; ++w) s += warp_o[w][c];
      o[c] = s;
      sq += double(s) * double(s);
    }
    const double norm = sqrt(block_reduce(sq, [](double a, double b) { return a + b; }, red));
    if (!(norm > 0)) continue;  // a zero output points nowhere (uniform: every thread has the block's norm)
    for (int t = warp; t < n; t += kScoreWarps) {
      const float s = warp_dot<D>(o, evict_row<D>(g, seq, layer, 1, head, t, qe));
      if (lane == 0) part[t] += p[t] * double(s) / norm;
    }
  }
}

// score[h][t] = Σ_i part[i][h][t], in query order.
__global__ void evict_sum_kernel(const double* part, int n_q, int64_t per_query, double* score) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= per_query) return;
  double s = 0.0;
  for (int i = 0; i < n_q; ++i) s += part[i * per_query + x];
  score[x] = s;
}

template <int D>
__global__ void evict_gather_kernel(CacheGeometry g, int layer, int seq, int P, const int* keep, int kept,
                                    uint16_t* tmp) {
  const int slot = blockIdx.x, head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x;
  const int pos = keep[int64_t(head) * kept + slot];
  tmp[((int64_t(kv) * g.n_kv + head) * kept + slot) * D + c] =
      evict_row<D>(g, seq, layer, kv, head, pos, quant_end(g, P - 1))[c];
}

template <int D>
__global__ void evict_place_kernel(CacheGeometry g, int layer, int seq, int kept, const uint16_t* tmp) {
  const int slot = blockIdx.x, head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x;
  uint16_t* dst = const_cast<uint16_t*>(evict_row<D>(g, seq, layer, kv, head, slot, quant_end(g, kept - 1)));
  dst[c] = tmp[((int64_t(kv) * g.n_kv + head) * kept + slot) * D + c];
}

}  // namespace

int launch_evict_scores(const CacheGeometry& g, int layer, int seq, int P, const float* d_obs, int n_heads, float scale,
                        double* d_p, double* d_part, double* d_score, void* stream) {
  if (P <= 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int n_q = P < kEvictObserve ? P : kEvictObserve;
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto, auto dim) {
    constexpr int D = decltype(dim)::value;
    evict_scores_kernel<D><<<dim3(unsigned(g.n_kv), unsigned(n_q)), kScoreThreads, 0, st>>>(
        g, layer, seq, P, d_obs, n_heads, scale, d_p, d_part);
    e = cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  const int64_t per_query = int64_t(g.n_kv) * P;
  evict_sum_kernel<<<unsigned((per_query + 255) / 256), 256, 0, st>>>(d_part, n_q, per_query, d_score);
  return cudaGetLastError();
}

int launch_evict_compact(const CacheGeometry& g, int layer, int seq, int P, const int* d_keep, int kept,
                         uint16_t* d_tmp, void* stream) {
  if (kept <= 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  int e = cudaErrorInvalidValue;
  with_instance(g.instance, g.head_dim, [&](auto, auto dim) {
    constexpr int D = decltype(dim)::value;
    const dim3 grid(unsigned(kept), unsigned(g.n_kv), 2);
    evict_gather_kernel<D><<<grid, D, 0, st>>>(g, layer, seq, P, d_keep, kept, d_tmp);
    if ((e = cudaGetLastError()) != cudaSuccess) return;
    evict_place_kernel<D><<<grid, D, 0, st>>>(g, layer, seq, kept, d_tmp);
    e = cudaGetLastError();
  });
  return e;
}

}  // namespace kvq::cuda
