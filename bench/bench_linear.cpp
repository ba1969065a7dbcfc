// Micro-benchmark of the CPU linear layer (model/linear.h) at Qwen3-8B's shapes and models/ref's (ref_*: gate_proj,
// down_proj, the output layer): the same weights read as bf16 where they lie (a checkpoint's representation since
// issue 39: the Bf16Gemv or row kernels for decode, widened tiles + sgemm for prefill)
// at AVX-512 and AVX2, and as fp32 (the representation before it: sgemv / sgemm in place), for a decode step (1 row),
// a batched decode step of 16 sequences (16 rows: still the row kernels, Linear::kGemvRows) and a prefill chunk (512
// rows), on the process's threads (-t as kvq's). The weights stream from DRAM: several copies are cycled so that
// they never sit in the last-level cache.
// Prints per run: weight bytes read per call, GB/s of them, and GFLOP/s (2 flops per multiply-add).
//   KVQ_BENCH_THREADS=2 build/kvq_bench_linear [--benchmark_filter=prefill] [--benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true]: on a shared machine, the min of interleaved repetitions
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "common/half.h"
#include "common/thread_pool.h"
#include "model/linear.h"
#include "simd/simd.h"

namespace {

struct Shape {
  const char* name;
  int out, in;
};
constexpr Shape kShapes[] = {{"q_proj", 4096, 4096},  {"gate_proj", 12288, 4096}, {"down_proj", 4096, 12288},
                             {"ref_gate", 1280, 384}, {"ref_down", 384, 1280},     {"ref_lm", 8192, 384}};

int bench_threads() {
  const char* t = std::getenv("KVQ_BENCH_THREADS");
  return t ? std::atoi(t) : 2;
}

void BM_Linear(benchmark::State& state, Shape sh, kvq::DType dtype, int rows, kvq::SimdLevel simd) {
  if (!kvq::simd_level_supported(simd)) {
    state.SkipWithError("SIMD level not supported on this CPU");
    return;
  }
  static kvq::ThreadPool pool(bench_threads());
  static bool blas_threads = [] {
    openblas_set_num_threads(bench_threads());
    return true;
  }();
  (void)blas_threads;
  const size_t n = size_t(sh.out) * sh.in, esize = kvq::dtype_size(dtype);
  const int copies = int(std::max<size_t>(2, (size_t(512) << 20) / (n * esize) + 1));  // > last-level cache
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<std::vector<uint8_t>> bytes(size_t(copies), std::vector<uint8_t>(n * esize));
  for (auto& b : bytes)
    for (size_t i = 0; i < n; ++i) {
      const float v = kvq::bf16_to_f32(kvq::f32_to_bf16(nd(rng)));  // a bf16 checkpoint's values either way
      if (dtype == kvq::DType::F32) {
        std::memcpy(b.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = kvq::f32_to_bf16(v);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
    }
  std::vector<kvq::Linear> layers;
  for (const auto& b : bytes) {
    kvq::WeightTensor w;
    w.dtype = dtype, w.rows = sh.out, w.cols = sh.in, w.data = b.data();
    layers.emplace_back(w, std::vector<float>(), simd);
  }
  std::vector<float> x(size_t(rows) * sh.in), y(size_t(rows) * sh.out);
  for (float& v : x) v = nd(rng);
  size_t i = 0;
  for (auto _ : state) {
    layers[i++ % layers.size()].apply(x.data(), rows, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_bytes"] = double(n * esize);
  state.counters["GB/s"] = benchmark::Counter(double(n * esize), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(n) * rows * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (const Shape& sh : kShapes)
    for (int rows : {1, 16, 512})
      for (kvq::DType dt : {kvq::DType::BF16, kvq::DType::F32})
        for (kvq::SimdLevel simd : {kvq::SimdLevel::kAvx512, kvq::SimdLevel::kAvx2}) {
          if (dt == kvq::DType::F32 && simd != kvq::SimdLevel::kAvx512) continue;  // sgemv / sgemm: OpenBLAS's level
          const std::string name = std::string(rows == 1 ? "decode/" : rows == 16 ? "batch16/" : "prefill/") +
                                   sh.name + "/" + (dt == kvq::DType::BF16 ? "bf16_in_place/" : "fp32") +
                                   (dt == kvq::DType::BF16 ? kvq::simd_level_name(simd) : "");
          benchmark::RegisterBenchmark(name.c_str(), BM_Linear, sh, dt, rows, simd)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime()
              ->MinTime(rows == 1 ? 1.0 : 3.0)
              ->ComputeStatistics("min",
                                  [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
        }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
