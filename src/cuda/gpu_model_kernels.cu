// Kernels of the GPU forward pass (launchers declared in gpu_model_kernels.h). fp32 arithmetic in the order the
// CPU model (model/model.cpp) uses, so the two differ only by GEMM rounding and libm ulps.
#include "cuda/gpu_model_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvq::cuda::kernels {

namespace {

constexpr int kThreads = 256;  // threads per block of every kernel here

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

int launched() { return int(cudaGetLastError()); }

__device__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

template <class T>
__device__ float load_weight(const T* p, int64_t i);
template <>
__device__ float load_weight<uint16_t>(const uint16_t* p, int64_t i) { return bf16_bits_to_float(p[i]); }
template <>
__device__ float load_weight<float>(const float* p, int64_t i) { return p[i]; }

template <class T>
__global__ void embed_gather_kernel(const T* table, const int32_t* ids, int rows, int dim, float* x) {
  const int64_t n = int64_t(rows) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    x[i] = load_weight(table, int64_t(ids[r]) * dim + c);
  }
}

// Sum of v over the block (kThreads threads), returned to every thread.
__device__ double block_sum(double v) {
  __shared__ double part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  __syncthreads();  // part[] may be reused by the next call
  return s;
}

__global__ void rms_norm_kernel(const float* x, int dim, const float* w, float eps, float* y) {
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  double ss = 0;  // double, as the CPU model sums
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += double(xr[c]) * xr[c];
  ss = block_sum(ss);
  const float inv = 1.f / sqrtf(float(ss / dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = w[c] * (xr[c] * inv);
}

__global__ void add_bias_kernel(float* y, int rows, int cols, const float* bias) {
  const int64_t n = int64_t(rows) * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

__global__ void rope_kernel(float* x, int rows, int heads, int d, const int32_t* pos, const float* inv_freq,
                            float scale) {
  const int half = d / 2;
  const int64_t n = int64_t(rows) * heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int f = int(i % half);
    const int64_t rh = i / half;  // row * heads + head
    const int r = int(rh / heads);
    const float angle = float(pos[r]) * inv_freq[f];
    double s, c;
    sincos(double(angle), &s, &c);
    const float cf = float(c), sf = float(s);
    float* v = x + rh * d;
    const float a = v[f], b = v[f + half];
    const float o0 = a * cf - b * sf, o1 = b * cf + a * sf;
    v[f] = scale == 1.f ? o0 : o0 * scale;
    v[f + half] = scale == 1.f ? o1 : o1 * scale;
  }
}

__global__ void swiglu_kernel(float* gate, const float* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.f + expf(-g)) * up[i];
  }
}

__global__ void residual_add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int count, int dim, float* out) {
  const int64_t n = int64_t(count) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim, c = i % dim;
    out[i] = x[int64_t(rows[j]) * dim + c];
  }
}

__global__ void argmax_rows_kernel(const float* x, int cols, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  float best = -INFINITY;
  int idx = cols;  // "none yet"
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {  // increasing c: the first of equal values is kept
    const float v = xr[c];
    if (idx == cols || v > best) best = v, idx = c;
  }
  __shared__ float sv[kThreads];
  __shared__ int si[kThreads];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = idx;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = sv[threadIdx.x + s];
      const int oi = si[threadIdx.x + s];
      const bool take = oi != cols && (si[threadIdx.x] == cols || ov > sv[threadIdx.x] ||
                                       (ov == sv[threadIdx.x] && oi < si[threadIdx.x]));
      if (take) sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] == cols ? 0 : si[0];
}

__global__ void finite_rows_kernel(const float* x, int cols, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  double bad = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) bad += isfinite(xr[c]) ? 0.0 : 1.0;
  bad = block_sum(bad);
  if (threadIdx.x == 0) out[blockIdx.x] = bad == 0 ? 1 : 0;
}

}  // namespace

int embed_gather_bf16(const uint16_t* table, const int32_t* ids, int rows, int dim, float* x, void* stream) {
  embed_gather_kernel<<<grid_for(int64_t(rows) * dim), kThreads, 0, as_stream(stream)>>>(table, ids, rows, dim, x);
  return launched();
}

int embed_gather_f32(const float* table, const int32_t* ids, int rows, int dim, float* x, void* stream) {
  embed_gather_kernel<<<grid_for(int64_t(rows) * dim), kThreads, 0, as_stream(stream)>>>(table, ids, rows, dim, x);
  return launched();
}

int rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y, void* stream) {
  if (rows <= 0) return 0;
  rms_norm_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(x, dim, w, eps, y);
  return launched();
}

int add_bias(float* y, int rows, int cols, const float* bias, void* stream) {
  add_bias_kernel<<<grid_for(int64_t(rows) * cols), kThreads, 0, as_stream(stream)>>>(y, rows, cols, bias);
  return launched();
}

int rope(float* x, int rows, int heads, int d, const int32_t* pos, const float* inv_freq, float scale, void* stream) {
  rope_kernel<<<grid_for(int64_t(rows) * heads * (d / 2)), kThreads, 0, as_stream(stream)>>>(x, rows, heads, d, pos,
                                                                                             inv_freq, scale);
  return launched();
}

int swiglu(float* gate, const float* up, int64_t n, void* stream) {
  swiglu_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(gate, up, n);
  return launched();
}

int residual_add(float* x, const float* y, int64_t n, void* stream) {
  residual_add_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, y, n);
  return launched();
}

int to_bf16(const float* x, int64_t n, uint16_t* out, void* stream) {
  to_bf16_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, n, reinterpret_cast<__nv_bfloat16*>(out));
  return launched();
}

int gather_rows(const float* x, const int32_t* rows, int count, int dim, float* out, void* stream) {
  gather_rows_kernel<<<grid_for(int64_t(count) * dim), kThreads, 0, as_stream(stream)>>>(x, rows, count, dim, out);
  return launched();
}

int argmax_rows(const float* x, int rows, int cols, int32_t* out, void* stream) {
  if (rows <= 0) return 0;
  argmax_rows_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(x, cols, out);
  return launched();
}

int finite_rows(const float* x, int rows, int cols, int32_t* out, void* stream) {
  if (rows <= 0) return 0;
  finite_rows_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(x, cols, out);
  return launched();
}

}  // namespace kvq::cuda::kernels
