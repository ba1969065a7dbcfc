// Dot products and axpys of float rows with 8 independent partial sums, so that -O2 vectorizes them (a plain
// reduction keeps its order and stays scalar). n is a multiple of 8. The summation order differs from a plain loop:
// fast paths built on these are held to their scalar references by tolerance.
#pragma once

namespace kvq {

inline float dot8(const float* a, const float* b, int n) {
  float acc[8] = {};
  for (int c = 0; c < n; c += 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] += a[c + j] * b[c + j];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y[0..n) += w · x[0..n)
inline void axpy8(float w, const float* x, float* y, int n) {
  for (int c = 0; c < n; c += 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) y[c + j] += w * x[c + j];
  }
}

}  // namespace kvq
