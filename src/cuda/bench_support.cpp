#include "cuda/bench_support.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "cuda/blas.h"
#include "cuda/gpu_kernels.h"
#include "cuda/gpu_model_kernels.h"  // dummy_fill
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

double time_gemm_bf16(int rows, int out, int in, int iters) {
  KVQ_CHECK(rows >= 1 && out >= 1 && in >= 1, "bench gemm: shape {} x {} x {}", rows, out, in);
  const size_t w_bytes = size_t(out) * in * 2;
  const int copies = int(std::clamp<size_t>((size_t(512) << 20) / w_bytes + 1, 1, 64));  // >= 512 MiB in all
  std::vector<DeviceBuffer> w;
  cudaStream_t st = nullptr;
  for (int i = 0; i < copies; ++i) {
    w.emplace_back(w_bytes);
    check(kernels::dummy_fill({nullptr, w.back().as<uint16_t>()}, int64_t(out) * in, TensorInit::Normal, 0.02f,
                              0x5eed + i, 0, st),
          "fill W");
  }
  DeviceBuffer x(size_t(rows) * in * 2), y(size_t(rows) * out * 4);
  check(kernels::dummy_fill({nullptr, x.as<uint16_t>()}, int64_t(rows) * in, TensorInit::Normal, 1.f, 7, 1, st),
        "fill x");
  cublasHandle_t blas = nullptr;
  KVQ_CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "bench gemm: cublasCreate failed");
  const int reps = std::max(copies, 8);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const double ms = median_step_ms(
      [&] {
        for (int i = 0; i < reps && status == CUBLAS_STATUS_SUCCESS; ++i)
          status = gemm_bf16(blas, w[i % copies].get(), x.get(), rows, out, in, y.as<float>());
      },
      2, iters, st);
  cublasDestroy(blas);
  KVQ_CHECK(status == CUBLAS_STATUS_SUCCESS, "bench gemm: cublasGemmEx: {}", cublasGetStatusString(status));
  return ms / reps;
}

}  // namespace kvq::cuda
