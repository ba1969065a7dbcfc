// The CPU model's linear layers: y[n, out] = x[n, in] · Wᵀ (+ bias), W in Hugging Face's [out, in] layout, read where
// it lies (model/weights.h: the checkpoint's mapping, in its dtype). Activations and accumulation are fp32.
//
// bf16 / f16 weights:
//   - a decode step (n <= kGemvRows rows) reads W's 16-bit rows once, half the bytes of fp32 weights, each weight
//     widened exactly to fp32 and multiplied in fp32 FMAs: bf16 through the level's Bf16Gemv (simd/simd.h: pairs of
//     weights widened by two integer operations, x permuted to match once per call, 2 rows × 6 queries a pass at
//     AVX-512), f16 and the scalar level through the row kernels of the cache;
//   - larger n (prefill) runs OpenBLAS sgemm on W widened tile by tile into one scratch buffer of at most
//     kTileFloats floats (per calling thread): a W of at most that many elements is one tile, the very sgemm call
//     fp32 weights would make; a larger one with in <= out is cut into blocks of whole rows, each sgemm writing its
//     columns of y once; with in > out into slices of input columns, as many multiples of kSliceK as kTileFloats
//     holds for every row (and, past kTileFloats / kSliceK output rows, into row blocks), each accumulated into y by
//     sgemm with beta = 1.
//   - so are rows of a width the row kernels do not take (in % 32 != 0: head_dim 80's o_proj).
// f32 weights: sgemv for one row, sgemm otherwise, in place.
// Either way the result is the same fp32 maths, in another summation order.
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "model/weights.h"
#include "simd/simd.h"

namespace kvq {

class Linear {
 public:
  static constexpr int kGemvRows = 16;                 // rows up to which 16-bit weights are read row by row
  static constexpr size_t kTileFloats = size_t(8) << 20;  // 32 MiB: the largest W widened at once
  static constexpr int kSliceK = 512;                  // input columns of a slice when W is larger

  Linear() = default;
  // w: [out, in] (and bias: [out] or empty) must outlive the layer. simd: the level of the row kernels (simd/simd.h).
  explicit Linear(const WeightTensor& w, const std::vector<float>& bias = {}, SimdLevel simd = best_simd_level());

  void apply(const float* x, int n, float* y, ThreadPool& pool) const;
  // n rows of several sequences' decode steps (a batched step), through the row kernels or the Bf16Gemv
  // (reads_rows() only), kGemvRows rows a pass over W. Each row's result is bit-identical to apply() of that row alone
  // or in any block of <= kGemvRows rows (neither kernel's sums depend on the other rows).
  void apply_rows(const float* x, int n, float* y, ThreadPool& pool) const;

  bool reads_rows() const { return rows_.scores != nullptr; }  // decode steps read 16-bit rows row by row
  size_t decode_bytes() const { return w_.nbytes(); }          // W bytes a decode step reads
  int out() const { return int(w_.rows); }
  int in() const { return int(w_.cols); }

 private:
  void apply_row_block(const float* x, int n, float* y, ThreadPool& pool) const;  // row kernels, n <= kGemvRows
  void apply_tiles(const float* x, int n, float* y, ThreadPool& pool) const;  // widened tiles + sgemm

  WeightTensor w_;
  const float* bias_ = nullptr;  // [out], null when the layer has none
  RowKernels rows_{};            // bf16 / f16 row kernels, when in % 32 == 0
  Bf16Gemv gemv_{};              // bf16 weights at AVX2 and above, when in % 32 == 0
};

}  // namespace kvq
