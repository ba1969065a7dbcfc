// Launchers of the GPU forward pass's elementwise and row kernels (gpu_model_kernels.cu). Plain C++ (no CUDA or
// fmt types): every launcher enqueues on `stream` (a cudaStream_t) and returns the launch's cudaError_t as an int,
// which the caller checks with kvq::cuda::check(). All pointers are device pointers; matrices are row-major.
#pragma once

#include <cstdint>

namespace kvq::cuda::kernels {

// x[r, :] = table[ids[r], :] for r < rows; table [vocab, dim] in bf16 (uint16 bits) or fp32.
int embed_gather_bf16(const uint16_t* table, const int32_t* ids, int rows, int dim, float* x, void* stream);
int embed_gather_f32(const float* table, const int32_t* ids, int rows, int dim, float* x, void* stream);

// y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps) for r < rows (y may alias x). One block per row.
int rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y, void* stream);

// y[r, c] += bias[c] for [rows, cols].
int add_bias(float* y, int rows, int cols, const float* bias, void* stream);

// Rotary embedding, rotate-half layout, in place on x [rows, heads, d] with row r at position pos[r]:
// angle = float(pos) * inv_freq[f] (fp32 product), cos / sin in double rounded to float (as the CPU model), then
// every output is multiplied by scale when scale != 1 (the forward pass passes 1: GpuKvCache scales queries).
int rope(float* x, int rows, int heads, int d, const int32_t* pos, const float* inv_freq, float scale, void* stream);

// gate[i] = silu(gate[i]) * up[i] for i < n.
int swiglu(float* gate, const float* up, int64_t n, void* stream);

// x[i] += y[i] for i < n.
int residual_add(float* x, const float* y, int64_t n, void* stream);

// out[i] = bf16(x[i]) (round to nearest even) for i < n.
int to_bf16(const float* x, int64_t n, uint16_t* out, void* stream);

// out[j, :] = x[rows[j], :] for j < count (gathers each sequence's last row before the final norm).
int gather_rows(const float* x, const int32_t* rows, int count, int dim, float* out, void* stream);

// out[r] = index of the largest of x[r, 0..cols) (lowest index on ties) for r < rows. One block per row.
int argmax_rows(const float* x, int rows, int cols, int32_t* out, void* stream);

// out[r] = 1 if every x[r, :] is finite else 0, for r < rows (one block per row).
int finite_rows(const float* x, int rows, int cols, int32_t* out, void* stream);

}  // namespace kvq::cuda::kernels
