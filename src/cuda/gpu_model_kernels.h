// Launchers of the GPU forward pass's elementwise and row kernels (gpu_model_kernels.cu). Plain C++ (no CUDA or
// fmt types): every launcher enqueues on `stream` (a cudaStream_t) and returns the launch's cudaError_t as an int,
// which the caller checks with kvq::cuda::check(). All pointers are device pointers; matrices are row-major.
#pragma once

#include <cstdint>

#include "model/dummy_weights.h"
#include "model/gumbel.h"
#include "model/sampling_math.h"

namespace kvq::cuda::kernels {

// x[r, :] = table[ids[r], :] for r < rows; table [vocab, dim] in bf16 (uint16 bits) or fp32.
int embed_gather_bf16(const uint16_t* table, const int32_t* ids, int rows, int dim, float* x, void* stream);
int embed_gather_f32(const float* table, const int32_t* ids, int rows, int dim, float* x, void* stream);

// Where a row kernel writes the input of the next GEMM: exactly one of the two is set, fp32 or bf16 bits (round to
// nearest even), as the GEMM precision wants, so no conversion pass runs between the kernel and the GEMM.
struct RowsOut {
  float* f32 = nullptr;      // [rows, dim] fp32
  uint16_t* bf16 = nullptr;  // [rows, dim] bf16 bits
};

// out[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps) for r < rows (out may alias x). One block per row; dim at
// most kNormMaxDim (cudaErrorInvalidValue past it).
constexpr int kNormMaxDim = 8192;
int rms_norm(const float* x, int rows, int dim, const float* w, float eps, RowsOut out, void* stream);

// x[r, :] += y[r, :], then out[r, :] = rms_norm(x[r, :]) as above (out may alias y): the residual add that ends a
// block fused with the norm that starts the next.
int residual_rms_norm(float* x, const float* y, int rows, int dim, const float* w, float eps, RowsOut out,
                      void* stream);

// The attention projections' epilogue, one block per (row, head) of qkv [rows, (hq + 2 hk) d] (q heads, then k, then
// v, as the fused q/k/v GEMM writes them), in the CPU model's order: + bias (Qwen2; null = none), per-head RMSNorm of q
// and k (Qwen3; null = none), then RoPE of q and k at position pos[r] (rotate-half layout, angle = float(pos) *
// inv_freq[f] in fp32, cos / sin in double rounded to float). Writes q [rows, hq d], k and v [rows, hk d].
constexpr int kQkvMaxDim = 256;  // widest head dim of qkv_finish (cudaErrorInvalidValue past it)
struct QkvParams {
  int hq, hk, d;                     // query heads, kv heads, head dim (d <= kQkvMaxDim, even)
  const float* bias;                 // [(hq + 2 hk) d] or null
  const float *q_norm, *k_norm;      // [d] each, or both null
  float eps;                         // RMSNorm epsilon
  const int32_t* pos;                // [rows]
  const float* inv_freq;             // [d / 2]
};
int qkv_finish(const float* qkv, int rows, const QkvParams& p, float* q, float* k, float* v, void* stream);

// out[r, i] = silu(gu[r, i]) * gu[r, I + i] for i < I: the gate and up halves of the fused gate/up GEMM's rows
// [rows, 2I].
int swiglu(const float* gu, int rows, int I, RowsOut out, void* stream);

// x[i] += y[i] for i < n.
int residual_add(float* x, const float* y, int64_t n, void* stream);

// out[i] = bf16(x[i]) (round to nearest even) for i < n.
int to_bf16(const float* x, int64_t n, uint16_t* out, void* stream);

// out[j, :] = x[rows[j], :] for j < count (gathers each sequence's last row before the final norm).
int gather_rows(const float* x, const int32_t* rows, int count, int dim, float* out, void* stream);

// out[r] = index of the largest of x[r, 0..cols) (lowest index on ties) for r < rows. One block per row.
int argmax_rows(const float* x, int rows, int cols, int32_t* out, void* stream);

// The k largest of each row x[r, 0..cols) for r < rows, in the sampler's order (larger first, lower index on ties;
// -0 equal to +0): ids[r·k + i] and vals[r·k + i]. 1 <= k <= min(kMaxSortedTopK, cols), else cudaErrorInvalidValue.
// One block per row.
int top_k_rows(const float* x, int rows, int cols, int k, int32_t* ids, float* vals, void* stream);

// out[r] = row r's draw by the Gumbel-max trick (model/gumbel.h: argmax of x[r, c] / T + noise(base, c), the lowest c
// on ties; draws[r]: device memory) for r < rows: the host sampler's token. One block per row.
int gumbel_argmax_rows(const float* x, int rows, int cols, const gumbel::Draw* draws, int32_t* out, void* stream);

// out[r] = row r's smath::RowMass at queries[r] (device memory) for r < rows: the host sampler's bits. One block per
// row.
int row_mass(const float* x, int rows, int cols, const smath::MassQuery* queries, smath::RowMass* out, void* stream);

// out[r] = 1 if every x[r, :] is finite else 0, for r < rows (one block per row).
int finite_rows(const float* x, int rows, int cols, int32_t* out, void* stream);

// --dummy-weights: out[i] = dummy_value(init, std, seed, rng_stream, i) for i < n (model/dummy_weights.h: the
// host's Weights::dummy values, bit for bit), as bf16 bits or fp32 as `out` says.
int dummy_fill(RowsOut out, int64_t n, TensorInit init, float std, uint64_t seed, uint32_t rng_stream, void* stream);

}  // namespace kvq::cuda::kernels
