// Host helpers for GPU benchmarks (kvq bench attention --device cuda, bench gemm): event timing, the read-bandwidth
// probe, device memory, random fills and a decode-step GEMM timed. Plain C++ header; throws kvq::Error on CUDA
// failures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvq::cuda {

// Runs `step` (which enqueues work on `stream`) `warmup` times untimed, then `iters` times each between two CUDA
// events; returns the median milliseconds.
double median_step_ms(const std::function<void()>& step, int warmup, int iters, void* stream);
// Streaming read bandwidth of the device (bytes / s): 16-byte loads over a buffer of `bytes`, median of passes.
double read_bandwidth_probe(size_t bytes);
// Free and total device memory, bytes.
size_t free_device_memory(size_t* total = nullptr);
// d[0, n) <- scale * N(0, 1), deterministic in (seed, index), on `stream`.
void fill_normal(float* d, size_t n, uint64_t seed, float scale, void* stream);

// kvq bench gemm: one GEMM of the decode step as GpuModel runs it with bf16 GEMMs, y[rows, out] = x[rows, in] · W^T
// (cublasGemmEx: bf16 W and x, fp32 accumulation and y, GpuModel's 32 MiB workspace), and optionally the first
// `lt_algos` algorithms cuBLASLt's heuristic offers for the same operation, each timed. W is read cold: the calls
// cycle over copies of W that together exceed the L2 cache, and a timed step is at least 8 calls back to back, as a
// decode step's GEMMs follow one another (a lone call between two events would also time the launch gap).
struct GemmTiming {
  double ms = 0;         // median milliseconds of one cublasGemmEx call
  double lt_ms = 0;      // the fastest cuBLASLt algorithm's (0: none timed)
  int lt_timed = 0;      // cuBLASLt algorithms timed
  int lt_rank = -1;      // the fastest one's place in the heuristic's order (0: its first choice)
  char lt_algo[64] = {}; // the fastest one: "id A tile T stages S split-k K"
};
GemmTiming time_gemm_bf16(int rows, int out, int in, int iters, int lt_algos = 0);

}  // namespace kvq::cuda
