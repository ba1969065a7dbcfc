// Benchmark helpers: a counter-based Gaussian fill (fast random K / V / Q on the device) and the read-bandwidth
// probe (16-byte loads over a large buffer, timed with CUDA events) that `kvq bench attention --device cuda`
// reports its percentages against.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/gpu_kernels.h"
#include "model/dummy_weights.h"  // splitmix64

namespace kvq::cuda {

namespace {

__global__ void fill_normal_kernel(float* d, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x100000001b3ull ^ splitmix64(i));
    const float u1 = (float(uint32_t(r >> 40)) + 1.f) * (1.f / 16777217.f);  // (0, 1]
    const float u2 = float(uint32_t(r) & 0xffffffu) * (1.f / 16777216.f);
    d[i] = scale * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
  }
}

__global__ void read_probe_kernel(const uint4* d, size_t n, unsigned long long* sink) {
  uint32_t a = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(d + i);  // streaming: do not keep the buffer in L2
    a ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (a == 0x9e3779b9u) atomicAdd(sink, 1ull);  // practically never; keeps the loads alive
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 132;
  return n;
}

}  // namespace

int launch_fill_normal(float* d, size_t n, uint64_t seed, float scale, void* stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = std::min<size_t>((n + 255) / 256, size_t(sm_count()) * 16);
  fill_normal_kernel<<<unsigned(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(d, n, seed, scale);
  return cudaGetLastError();
}

int read_probe(const void* d, size_t bytes, unsigned long long* d_sink, int iters, float* ms_median, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const size_t n = bytes / 16;
  const unsigned blocks = unsigned(sm_count()) * 8;
  cudaEvent_t e0, e1;
  int err = cudaEventCreate(&e0);
  if (err != cudaSuccess) return err;
  if ((err = cudaEventCreate(&e1)) != cudaSuccess) return err;
  std::vector<float> ms;
  for (int it = -2; it < iters && err == cudaSuccess; ++it) {  // two warm-up passes
    cudaEventRecord(e0, st);
    read_probe_kernel<<<blocks, 512, 0, st>>>(static_cast<const uint4*>(d), n, d_sink);
    cudaEventRecord(e1, st);
    if ((err = cudaGetLastError()) != cudaSuccess) break;
    if ((err = cudaEventSynchronize(e1)) != cudaSuccess) break;
    float t = 0;
    err = cudaEventElapsedTime(&t, e0, e1);
    if (it >= 0) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (err == cudaSuccess && !ms.empty()) {
    std::sort(ms.begin(), ms.end());
    *ms_median = ms[ms.size() / 2];
  }
  return err;
}

}  // namespace kvq::cuda
