// The cuBLAS GEMMs of the forward pass (GpuModel::linear, gpu_model.cpp); kvq bench gemm (bench_support.cpp) times
// the bf16 one, the very call a decode step makes. Plain C++ with the cuBLAS header.
#pragma once

#include <cublas_v2.h>

#include <cstddef>

namespace kvq::cuda {

// The cuBLAS workspace GpuModel gives its handle (cuBLAS's recommendation for Hopper), and bench gemm its calls.
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// y[rows, out] = x[rows, in] · W^T with bf16 W (row-major [out, in]) and x, fp32 accumulation and output, enqueued on
// the handle's stream. cuBLAS is column-major: y^T = W · x^T, with W read as the column-major [in, out] matrix
// transposed.
inline cublasStatus_t gemm_bf16(cublasHandle_t blas, const void* W, const void* x, int rows, int out, int in,
                                float* y) {
  const float one = 1.f, zero = 0.f;
  return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, W, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                      &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// The same with fp32 W and x (--gpu-gemm fp32), pedantic fp32 arithmetic: no TF32 or other reduced-precision path.
inline cublasStatus_t gemm_f32(cublasHandle_t blas, const void* W, const float* x, int rows, int out, int in,
                               float* y) {
  const float one = 1.f, zero = 0.f;
  return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, W, CUDA_R_32F, in, x, CUDA_R_32F, in, &zero,
                      y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
}

}  // namespace kvq::cuda
