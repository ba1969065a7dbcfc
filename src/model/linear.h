// The CPU model's linear layers: y[n, out] = x[n, in] · Wᵀ (+ bias), W in Hugging Face's [out, in] layout.
//
// A decode step (n <= kGemvRows rows) is bound by reading W once. When every weight is exactly a bfloat16 (a bf16
// checkpoint: the fp32 weights are its values widened), the layer keeps a bf16 copy and reads that — half the bytes —
// through the bf16 row kernels of the cache (simd/simd.h: each weight widened exactly to fp32, fp32 FMAs), so the
// result is the same fp32 maths as OpenBLAS's on the fp32 weights, in another summation order. Larger n (prefill)
// runs OpenBLAS sgemm on the fp32 weights; so do weights that are not all bf16 (f16 or f32 checkpoints).
// The bf16 copy costs half of the fp32 weights again in memory (the fp32 ones stay: calibration and the GPU upload
// read them).
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "simd/simd.h"

namespace kvq {

class Linear {
 public:
  static constexpr int kGemvRows = 16;  // rows up to which the bf16 copy is read (the row kernels' query chunk)

  Linear() = default;
  // w: [out, in] (and bias: [out] or empty) must outlive the layer.
  // simd: the level of the bf16 row kernels (simd/simd.h).
  Linear(const std::vector<float>& w, int out, int in, const std::vector<float>& bias = {},
         SimdLevel simd = best_simd_level());

  void apply(const float* x, int n, float* y, ThreadPool& pool) const;
  // n rows of several sequences' decode steps (a batched step), through the bf16 row kernels (reads_bf16() only), 16
  // rows a pass over W. Each row's result is bit-identical to apply() of that row alone or in any block of <= 16
  // rows (the row kernels' sums do not depend on the other rows).
  void apply_rows(const float* x, int n, float* y, ThreadPool& pool) const;

  bool reads_bf16() const { return !w_bf16_.empty(); }  // decode steps read the bf16 copy
  size_t decode_bytes() const { return size_t(out_) * in_ * (reads_bf16() ? 2 : 4); }  // W bytes a decode step reads
  int out() const { return out_; }
  int in() const { return in_; }

 private:
  const float* w_ = nullptr;
  const float* bias_ = nullptr;  // [out], null when the layer has none
  int out_ = 0, in_ = 0;
  std::vector<uint16_t> w_bf16_;  // [out, in] bf16 bits, empty unless every weight is exactly a bf16
  RowKernels bf16_{};
};

}  // namespace kvq
