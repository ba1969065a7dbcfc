#include "cuda/bench_support.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
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

namespace {

// The cuBLASLt form of gemm_bf16 (blas.h): column-major y^T[out, rows] = op(W)[out, in] · x^T[in, rows] with W read
// as the column-major [in, out] matrix transposed.
struct LtGemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtGemm(int rows, int out, int in, size_t workspace) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    try {
      need(cublasLtCreate(&lt), "cublasLtCreate");
      need(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
      need(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
      need(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
      need(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, in, out, in), "layout of W");
      need(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, in, rows, in), "layout of x");
      need(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, out, rows, out), "layout of y");
      need(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      need(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                sizeof workspace),
           "workspace preference");
    } catch (...) {
      release();
      throw;
    }
  }
  static void need(cublasStatus_t s, const char* what) {
    KVQ_CHECK(s == CUBLAS_STATUS_SUCCESS, "bench gemm: cuBLASLt {}: {}", what, cublasGetStatusString(s));
  }
  ~LtGemm() { release(); }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  void release() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    pref = nullptr, c = b = a = nullptr, op = nullptr, lt = nullptr;
  }
  std::vector<cublasLtMatmulHeuristicResult_t> algorithms(int n) const {
    std::vector<cublasLtMatmulHeuristicResult_t> r(size_t(std::max(n, 1)));
    int got = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, n, r.data(), &got) != CUBLAS_STATUS_SUCCESS) got = 0;
    r.resize(size_t(got));
    return r;
  }
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo, const void* W, const void* x, float* y, void* ws,
                     size_t ws_bytes, cudaStream_t st) const {
    const float one = 1.f, zero = 0.f;
    return cublasLtMatmul(lt, op, &one, W, a, x, b, &zero, y, c, y, c, &algo, ws, ws_bytes, st);
  }
};

uint32_t algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;  // ID is an int32, the others uint32 (or uint16: read into the low bytes)
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return v;
}

}  // namespace

GemmTiming time_gemm_bf16(int rows, int out, int in, int iters, int lt_algos) {
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
  DeviceBuffer x(size_t(rows) * in * 2), y(size_t(rows) * out * 4), workspace(kBlasWorkspaceBytes);
  check(kernels::dummy_fill({nullptr, x.as<uint16_t>()}, int64_t(rows) * in, TensorInit::Normal, 1.f, 7, 1, st),
        "fill x");
  cublasHandle_t blas = nullptr;
  KVQ_CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "bench gemm: cublasCreate failed");
  const int reps = std::max(copies, 8);
  // Median milliseconds of one call(W): timed steps of reps calls over the copies of W; status: the first failure.
  auto per_call_ms = [&](auto call, cublasStatus_t& status) {
    const auto step = [&] {
      for (int i = 0; i < reps && status == CUBLAS_STATUS_SUCCESS; ++i) status = call(w[i % copies].get());
    };
    return median_step_ms(step, 2, iters, st) / reps;
  };
  cublasStatus_t status = cublasSetWorkspace(blas, workspace.get(), workspace.bytes());
  GemmTiming t;
  if (status == CUBLAS_STATUS_SUCCESS)
    t.ms = per_call_ms([&](const void* W) { return gemm_bf16(blas, W, x.get(), rows, out, in, y.as<float>()); },
                       status);
  cublasDestroy(blas);
  KVQ_CHECK(status == CUBLAS_STATUS_SUCCESS, "bench gemm: cublasGemmEx: {}", cublasGetStatusString(status));
  if (lt_algos <= 0) return t;

  const LtGemm lt(rows, out, in, workspace.bytes());
  const std::vector<cublasLtMatmulHeuristicResult_t> algos = lt.algorithms(lt_algos);
  for (size_t k = 0; k < algos.size(); ++k) {
    if (algos[k].state != CUBLAS_STATUS_SUCCESS || algos[k].workspaceSize > workspace.bytes()) continue;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    const auto call = [&](const void* W) {
      return lt.run(algos[k].algo, W, x.get(), y.as<float>(), workspace.get(), workspace.bytes(), st);
    };
    const double ms = per_call_ms(call, s);
    if (s != CUBLAS_STATUS_SUCCESS) continue;  // an algorithm that refuses this problem is skipped
    ++t.lt_timed;
    if (t.lt_ms == 0 || ms < t.lt_ms) {
      t.lt_ms = ms, t.lt_rank = int(k);
      const auto& a = algos[k].algo;
      std::snprintf(t.lt_algo, sizeof t.lt_algo, "id %u tile %u stages %u split-k %u",
                    algo_config(a, CUBLASLT_ALGO_CONFIG_ID), algo_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                    algo_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
    }
  }
  return t;
}

}  // namespace kvq::cuda
