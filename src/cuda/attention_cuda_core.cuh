// The CUDA-core attention kernel (decode_attention.cu's step 2 for the rows tensor cores do not run: int4, int8,
// KIVI, OScaR, TurboQuant, llama.cpp's blocks) and its instances, included only by the shard files
// (attention_cuda_core/shard_S.cu), each of which instantiates cuda_core_kernel_in_shard<S> and so the kernels of the
// (row, d) pairs cuda_core_shard assigns it. decode_attention.cu's header comment describes the kernel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention_cuda_core.h"
#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"

namespace kvq::cuda {

namespace cuda_core_detail {

using dev::warp_max, dev::warp_sum;

// K, V: the device codecs of the quantized region's keys and values of D values a row; W: the window rows' (bf16, or
// int8 for KV4-RL: RowWindows).
// GQ: register arrays for GQ query heads; instances GQ = 1, 2, 4 (g == GQ, a compile-time constant) and
// GQ = kMaxGroupHeads (any g <= 8 at run time). Lane l takes the value channels 4 (l + 32 k), k < kVecs, that exist.
template <class K, class V, class W, int D, int GQ>
__global__ void __launch_bounds__(kCudaCoreWarps * 32) attention_kernel(CacheGeometry geo, AttentionLaunch a) {
  constexpr int kVecs = (D / 4 + 31) / 32;  // 4-channel value chunks per lane
  constexpr bool kFull = D % 128 == 0;      // every lane holds kVecs chunks
  const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = GQ < kMaxGroupHeads ? GQ : a.n_heads / geo.n_kv;
  const RowDesc rd = a.rows[row];
  const int t = rd.pos, qe = view_quant_end(geo, rd.seq, t);
  const int first = split * a.split_tokens, end = min(t + 1, first + a.split_tokens);  // the split's positions
  const int begin = a.window > 0 ? max(first, t - a.window + 1) : first;  // a sliding window: (t - window, t]

  __shared__ float qs[kMaxGroupHeads][D];
  __shared__ float w_acc[kCudaCoreWarps][kMaxGroupHeads][D];
  __shared__ float w_m[kCudaCoreWarps][kMaxGroupHeads], w_l[kCudaCoreWarps][kMaxGroupHeads];
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

  for (int tile = begin + warp * 32; tile < end; tile += kCudaCoreWarps * 32) {
    const int p = tile + lane;
    const bool valid = p < end;
    float s[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) s[h] = 0.f;
    if (valid) {
      const dev::RowRef kr = dev::view_row(geo, rd.seq, a.layer, 0, head, p, qe);
      if (!kr.quant) {
        W::template score<GQ>(kr.ptr, 0, geo.window_group, qs, qsum, g, s);
      } else if constexpr (dev::ReadsTable<K>) {
        K::template score<GQ>(kr.ptr, dev::key_table<K>(geo, head), qs, g, s);
      } else {
        K::template score<GQ>(kr.ptr, kr.block_row, geo.k_group, qs, qsum, g, s);
        if constexpr (dev::token_scaled<K>()) {  // OScaR: ν_p · q·k̂
          const float nu = *dev::token_scales(geo, rd.seq, a.layer, p);
#pragma unroll
          for (int h = 0; h < GQ; ++h) s[h] *= nu;
        }
        if constexpr (dev::tensor_scaled<K>()) {  // vLLM's FP8: the layer's k_scale · q·code
#pragma unroll
          for (int h = 0; h < GQ; ++h) s[h] *= geo.k_scale;
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
      const dev::RowRef vr = dev::view_row(geo, rd.seq, a.layer, 1, head, tile + j, qe);
      float v4[4 * kVecs];
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (!holds(k)) continue;
        if (vr.quant) {
          V::values4(vr.ptr, 0, geo.v_group, 4 * (lane + 32 * k), v4 + 4 * k);
          if constexpr (dev::tensor_scaled<V>()) {
#pragma unroll
            for (int i = 0; i < 4; ++i) v4[4 * k + i] *= geo.v_scale;
          }
        } else {
          W::values4(vr.ptr, 0, geo.window_group, 4 * (lane + 32 * k), v4 + 4 * k);
        }
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
  dev::write_block_partial<kCudaCoreWarps, D>(w_m, w_l, w_acc, g, part, a);
}

// The CUDA-core kernel instance of codecs K, V (windows W) at head dim D for a GQA group of gq query heads (kEvery: the
// row's per-g instances are compiled at this D, gpu_every_gqa).
template <class K, class V, class W, int D, bool kEvery>
CudaCoreKernel gqa_instance(int gq) {
  if constexpr (!kEvery) {
    return attention_kernel<K, V, W, D, kMaxGroupHeads>;
  } else {
    switch (gq) {
      case 1: return attention_kernel<K, V, W, D, 1>;
      case 2: return attention_kernel<K, V, W, D, 2>;
      case 4: return attention_kernel<K, V, W, D, 4>;
      default: return attention_kernel<K, V, W, D, kMaxGroupHeads>;
    }
  }
}

}  // namespace cuda_core_detail

template <int S>
CudaCoreKernel cuda_core_kernel_in_shard(const CacheGeometry& geo, int gq) {
  CudaCoreKernel k = nullptr;
  with_instance(geo.instance, geo.head_dim, [&](auto row, auto dim) {
    constexpr int I = decltype(row)::value, D = decltype(dim)::value;
    constexpr GpuInstance r = kGpuInstances[I];
    if constexpr (r.path == GpuPath::kCudaCore && cuda_core_shard(I, D) == S)
      k = cuda_core_detail::gqa_instance<RowKeys<I, D>, RowValues<I, D>, RowWindows<I, D>, D, gpu_every_gqa(r, D)>(
          gq);
  });
  return k;
}

}  // namespace kvq::cuda
