// Row primitives of the online softmax in attention.cpp (max and exp-and-sum over one row of scores), one
// implementation per instruction-set level, chosen at run time like the codec kernels (kv/simd.h).
//
// The SIMD levels compute exp with a Cephes-style polynomial: x = n·ln2 + r, |r| <= ln2/2, degree-6 polynomial
// in r, times 2^n built in the exponent bits. Relative error <= 2e-7 (about 2 float ulp) against std::exp for
// x in [-87, 0]; inputs below -87.3 give 0 (std::exp gives < 1.2e-38 there). Attention only calls exp on
// x = s - max <= 0, so the results are weights in [0, 1].
#pragma once

#include "kv/simd.h"

namespace kvq {

struct SoftmaxKernels {
  float (*max)(const float* x, int n);           // max of x[0, n); -inf for n == 0
  float (*exp_sum)(float* x, int n, float m);    // x[i] <- exp(x[i] - m) for i < n; returns the sum of the new x
};

// Throws kvq::Error if this CPU does not support the level.
SoftmaxKernels softmax_kernels(SimdLevel level);

// The scalar reference twins (std::exp, plain loops).
float softmax_max_ref(const float* x, int n);
float softmax_exp_sum_ref(float* x, int n, float m);

}  // namespace kvq
