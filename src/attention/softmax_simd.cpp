#include "attention/softmax_simd.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/error.h"

namespace kvq {

float softmax_max_ref(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float softmax_exp_sum_ref(float* x, int n, float m) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  return sum;
}

#if defined(__x86_64__)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_* operands
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace {

// Cephes expf coefficients (polynomial of exp(r) - 1 - r over r^2).
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kMinX = -87.3f, kMaxX = 88.3f;  // 2^n stays a normal float: n in [-126, 127]

#define KVQ_AVX2 __attribute__((target("avx2,fma")))
#define KVQ_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma")))

KVQ_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kMinX), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMinX)), _mm256_set1_ps(kMaxX));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT |
                                                                                 _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

KVQ_AVX2 float max_avx2(const float* x, int n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float r = -INFINITY;
  for (float v : lanes) r = v > r ? v : r;
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

KVQ_AVX2 float exp_sum_avx2(float* x, int n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {  // tail through a padded buffer
    float buf[8];
    for (int k = 0; k < 8; ++k) buf[k] = i + k < n ? x[i + k] : -INFINITY;
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(buf), mv));
    _mm256_storeu_ps(buf, e);
    for (int k = 0; i + k < n; ++k) x[i + k] = buf[k];
    sum = _mm256_add_ps(sum, e);  // padded lanes are exp(-inf) = 0
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

KVQ_AVX512 inline __m512 exp_avx512(__m512 x) {
  const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinX), _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(kMaxX));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT |
                                                                                     _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}

KVQ_AVX512 float max_avx512(const float* x, int n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), __mmask16((1u << (n - i)) - 1),
                                                      x + i));
  return _mm512_reduce_max_ps(m);
}

KVQ_AVX512 float exp_sum_avx512(float* x, int n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 k = __mmask16((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

SoftmaxKernels softmax_kernels(SimdLevel level) {
  KVQ_CHECK(simd_level_supported(level), "SIMD level {} is not supported by this CPU (best here: {})",
            simd_level_name(level), simd_level_name(best_simd_level()));
#if defined(__x86_64__)
  switch (level) {
    case SimdLevel::kAvx512Vnni:
    case SimdLevel::kAvx512: return {max_avx512, exp_sum_avx512};
    case SimdLevel::kAvx2: return {max_avx2, exp_sum_avx2};
    case SimdLevel::kScalar: break;
  }
#endif
  return {softmax_max_ref, softmax_exp_sum_ref};
}

}  // namespace kvq
