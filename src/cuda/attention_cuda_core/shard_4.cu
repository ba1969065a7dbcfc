// The CUDA-core attention kernels of the (row, d) pairs cuda_core_shard assigns to shard 4 (attention_cuda_core.h).
#include "cuda/attention_cuda_core.cuh"

namespace kvq::cuda {
template CudaCoreKernel cuda_core_kernel_in_shard<4>(const CacheGeometry&, int);
}  // namespace kvq::cuda
