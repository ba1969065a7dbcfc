#include "kv/transform.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvq {

namespace {

#if defined(__x86_64__) && !defined(KVQ_SIMD_OFF)
// x <- x · R (Transpose: x · R^T) for one row, R: [d, d] row-major, d a multiple of 16: the scalar loop below with 4
// output columns to a vector. AVX2 without FMA, so that each product and sum is rounded apart in the same order
// (a = 0 .. d-1 for every column): the result is bit-identical to the scalar loop's, and to the GPU's
// (cuda/kv_append.cu). R^T's columns are R's rows: 4x4 tiles of them are transposed in registers.
template <bool Transpose>
__attribute__((target("avx2"))) void rotate_row_avx2(float* x, const float* R, int d) {
  alignas(32) float out[kMaxHeadDimForRotation];
  for (int b0 = 0; b0 < d; b0 += 16) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (int a0 = 0; a0 < d; a0 += 4) {
      __m128 r[4][4];  // r[k][j]: the 4 factors of x[a0 + j] for output columns b0 + 4k .. b0 + 4k + 3
      for (int k = 0; k < 4; ++k) {
        if constexpr (Transpose) {
          for (int j = 0; j < 4; ++j) r[k][j] = _mm_loadu_ps(R + size_t(b0 + 4 * k + j) * d + a0);
          _MM_TRANSPOSE4_PS(r[k][0], r[k][1], r[k][2], r[k][3]);
        } else {
          for (int j = 0; j < 4; ++j) r[k][j] = _mm_loadu_ps(R + size_t(a0 + j) * d + b0 + 4 * k);
        }
      }
      for (int j = 0; j < 4; ++j) {
        const __m256d xa = _mm256_set1_pd(double(x[a0 + j]));
        for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_pd(acc[k], _mm256_mul_pd(xa, _mm256_cvtps_pd(r[k][j])));
      }
    }
    for (int k = 0; k < 4; ++k) _mm_store_ps(out + b0 + 4 * k, _mm256_cvtpd_ps(acc[k]));
  }
  std::copy_n(out, d, x);
}

bool rotate_fast(int d) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && d % 16 == 0 && d <= kMaxHeadDimForRotation;
}
#endif

// rows[i] <- rows[i] · R (transpose: rows[i] · R^T), R: [d, d] row-major, for n_rows rows of stride d.
// Accumulates in double so that a rotation and its inverse round-trip to float precision.
void rotate_rows(float* rows, int n_rows, const float* R, int d, bool transpose) {
#if defined(__x86_64__) && !defined(KVQ_SIMD_OFF)
  if (rotate_fast(d)) {
    for (int i = 0; i < n_rows; ++i) {
      float* x = rows + size_t(i) * d;
      transpose ? rotate_row_avx2<true>(x, R, d) : rotate_row_avx2<false>(x, R, d);
    }
    return;
  }
#endif
  std::vector<double> tmp(static_cast<size_t>(d));
  for (int i = 0; i < n_rows; ++i) {
    float* x = rows + size_t(i) * d;
    std::fill(tmp.begin(), tmp.end(), 0.0);
    if (!transpose) {
      for (int a = 0; a < d; ++a) {
        const double xa = x[a];
        const float* r = R + size_t(a) * d;
        for (int b = 0; b < d; ++b) tmp[size_t(b)] += xa * r[b];
      }
    } else {
      for (int b = 0; b < d; ++b) {
        const float* r = R + size_t(b) * d;
        double s = 0.0;
        for (int a = 0; a < d; ++a) s += double(x[a]) * r[a];
        tmp[size_t(b)] = s;
      }
    }
    for (int c = 0; c < d; ++c) x[c] = float(tmp[size_t(c)]);
  }
}

}  // namespace

void KvTransform::keys(int layer, int n, float* k) const {
  const int d = head_dim;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h) {
      float* row = k + (size_t(t) * n_kv_heads + h) * d;
      if (!key_mean.empty()) {
        const float* mu = key_mean.data() + (size_t(layer) * n_kv_heads + h) * d;
        for (int c = 0; c < d; ++c) row[c] -= mu[c];
      }
      if (!r_k.empty()) rotate_rows(row, 1, r_k.data() + (size_t(layer) * n_kv_heads + h) * d * d, d, false);
    }
}

void KvTransform::values(int layer, int n, float* v) const {
  if (r_v.empty()) return;
  const int d = head_dim;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h)
      rotate_rows(v + (size_t(t) * n_kv_heads + h) * d, 1, r_v.data() + (size_t(layer) * n_kv_heads + h) * d * d, d,
                  false);
}

void KvTransform::queries(int layer, int n, int n_heads, float* q) const {
  if (r_k.empty()) return;
  const int d = head_dim, g = n_heads / n_kv_heads;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < n_heads; ++j)
      rotate_rows(q + (size_t(t) * n_heads + j) * d, 1, r_k.data() + (size_t(layer) * n_kv_heads + j / g) * d * d, d,
                  false);
}

void KvTransform::outputs(int layer, int n, int n_heads, float* o) const {
  if (r_v.empty()) return;
  const int d = head_dim, g = n_heads / n_kv_heads;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < n_heads; ++j)
      rotate_rows(o + (size_t(t) * n_heads + j) * d, 1, r_v.data() + (size_t(layer) * n_kv_heads + j / g) * d * d, d,
                  true);
}

}  // namespace kvq
