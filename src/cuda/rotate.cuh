// The key/value rotation of rows held one channel per thread (the append and query kernels): x <- x · R for a
// per-(layer, kv head) matrix R, with the CPU's floating-point operations (kv/transform.cpp), so that the rows are
// bit-identical to the CPU cache's:
//   - a Hadamard (TransformPtrs::k_hadamard / v_hadamard = n > 0; R block-diagonal H_n · R[0][0]): the unnormalised
//     Walsh–Hadamard butterflies in double in the order of rotation/hadamard.cpp (log2 n passes), one product by
//     double(R[0][0]) and one rounding to float: O(D log n) a row;
//   - any other matrix (a calibrated rotation file): the dense product, accumulated in double in channel order.
// N rows that share R go through at once, so each element of R is read once for all of them (a GQA group's queries).
#pragma once

#include <cuda_runtime.h>

namespace kvq::cuda::dev {

// Every thread of a block of D threads calls it (thread c holds channel c of each of the N rows in x[]).
// scratch: N × D doubles of shared memory, free on entry and on return.
template <int D, int N>
__device__ __forceinline__ void rotate_rows(float (&x)[N], const float* __restrict__ R, int hadamard,
                                            double (*scratch)[D]) {
  const int c = threadIdx.x;
  if (hadamard > 0) {
    double v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = double(x[i]);
    for (int h = 1; h < hadamard; h *= 2) {  // pass h: the pair (j, j + h), j's bit h clear: (a + b, a - b)
#pragma unroll
      for (int i = 0; i < N; ++i) scratch[i][c] = v[i];
      __syncthreads();
      const bool low = (c & h) == 0;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const double p = scratch[i][c ^ h];
        v[i] = low ? __dadd_rn(v[i], p) : __dsub_rn(p, v[i]);
      }
      __syncthreads();
    }
    const double s = double(R[0]);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = float(__dmul_rn(v[i], s));
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) scratch[i][c] = double(x[i]);
  __syncthreads();
  double acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0;
#pragma unroll 8
  for (int a = 0; a < D; ++a) {
    const double r = double(__ldg(R + a * D + c));
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = __dadd_rn(acc[i], __dmul_rn(scratch[i][a], r));
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = float(acc[i]);
}

}  // namespace kvq::cuda::dev
