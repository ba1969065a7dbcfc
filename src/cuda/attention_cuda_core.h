// The CUDA-core attention kernels (attention_cuda_core.cuh) compiled in kCudaCoreShards translation units,
// attention_cuda_core/shard_S.cu, each the (instance row, head dim) pairs of cuda_core_shard(row, d) == S, so a build
// compiles them in parallel. In one file they were the build's critical path: decode_attention.cu alone took 285 s
// of one core on a 2-core host and 503 s of the H200 host's 16-core build (547 s).
// Plain C++, like gpu_kernels.h: decode_attention.cu dispatches through it and the host tests walk it.
#pragma once

#include "cuda/gpu_instances.h"
#include "cuda/gpu_kernels.h"

namespace kvq::cuda {

using CudaCoreKernel = void (*)(CacheGeometry, AttentionLaunch);
inline constexpr int kCudaCoreWarps = 4;  // threads of a block: kCudaCoreWarps x 32
inline constexpr int kCudaCoreShards = 8;

// The shard that compiles the kernels of instance row `instance` at head dim `head_dim` (a compiled d): the pairs
// taken in table order, round robin, so a row's head dims spread over the shards.
constexpr int cuda_core_shard(int instance, int head_dim) {
  int j = 0;
  while (j < kGpuHeadDimCount - 1 && kGpuHeadDims[j] != head_dim) ++j;
  return (instance * kGpuHeadDimCount + j) % kCudaCoreShards;
}

// The kernel of g's (instance, head_dim) for GQA groups of gq query heads when shard S compiles that pair and the
// row is a CUDA-core row; null otherwise. Defined in attention_cuda_core.cuh, instantiated once in shard_S.cu.
template <int S>
CudaCoreKernel cuda_core_kernel_in_shard(const CacheGeometry& g, int gq);

// The CUDA-core kernel of g's instance row at its head dim for groups of gq query heads (null for a tensor-core row
// or no row): the one dispatch over the shards (decode_attention.cu).
CudaCoreKernel cuda_core_kernel(const CacheGeometry& g, int gq);

}  // namespace kvq::cuda
