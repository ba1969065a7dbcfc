#include "cuda/bench_support.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "cuda/gpu_kernels.h"
#include "cuda/runtime.h"

namespace kvq::cuda {

double median_step_ms(const std::function<void()>& step, int warmup, int iters, void* stream) {
  KVQ_CHECK(iters >= 1 && warmup >= 0, "median_step_ms: iters {} warmup {}", iters, warmup);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < warmup; ++i) step();
  check(cudaStreamSynchronize(st), "benchmark warm-up");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(e0, st), "cudaEventRecord");
    step();
    check(cudaEventRecord(e1, st), "cudaEventRecord");
    check(cudaEventSynchronize(e1), "benchmark step");
    float t = 0;
    check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double read_bandwidth_probe(size_t bytes) {
  bytes = bytes / 16 * 16;
  DeviceBuffer buf(bytes), sink(sizeof(unsigned long long));
  check(cudaMemset(buf.get(), 1, bytes), "cudaMemset probe buffer");
  sink.zero();
  float ms = 0;
  check(read_probe(buf.get(), bytes, sink.as<unsigned long long>(), 10, &ms, nullptr), "read bandwidth probe");
  KVQ_CHECK(ms > 0, "read bandwidth probe: no time measured");
  return double(bytes) / (double(ms) * 1e-3);
}

size_t free_device_memory(size_t* total) {
  size_t f = 0, t = 0;
  check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  if (total) *total = t;
  return f;
}

void fill_normal(float* d, size_t n, uint64_t seed, float scale, void* stream) {
  check(launch_fill_normal(d, n, seed, scale, stream), "fill_normal kernel");
}

}  // namespace kvq::cuda
