// AVX2 + FMA + F16C row kernels and softmax primitives (8 floats per vector). Compiled for that target by the
// pragma below, called only when simd_level_supported(kAvx2). Every header is included BEFORE the pragma so that no
// inline function shared with other files is compiled for AVX2.
#include <cmath>
#include <cstring>
#include <utility>


#include "codecs/layout.h"
#include "codecs/llamacpp/llamacpp_blocks.h"
#include "common/half.h"
#include "simd/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace kvq {
namespace {

#include "codecs/llamacpp/simd_blocks_x86.h"

struct VAvx2 {
  using F = __m256;
  static constexpr int kW = 8, kMaxQBScores = 4, kMaxQBAcc = 2;  // 16 ymm registers
  static constexpr int kScoreChains = 4, kMaxQBRowScores = 2;     // 8 sums + a unit's 4 vectors
  // The bf16 decode-step product (simd_gemv_impl.h): 2 rows × 2 queries (8 sums of 16 ymm), 2 rows for one or two.
  static constexpr int kGemvRows = 2, kGemvQB = 2, kGemvRowsFew = 2;
  static void bf16_pairs(const uint8_t* p, F& even, F& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F bcast(float x) { return _mm256_set1_ps(x); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F exp2i(F n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static F zero_below(F x, F lo, F y) { return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), y); }
  static __m256i lanes_below(int n) {  // all-ones in lanes [0, n)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F load_partial(const float* p, int n, float fill) {
    const __m256i m = lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_partial(float* p, F v, int n) { _mm256_maskstore_ps(p, lanes_below(n), v); }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void hsum4(const F* v, float* out) {
    const __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
    const __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  // dst[j·dst_stride + i] = src[i·src_stride + j] for an 8 × 8 block: pairs of rows interleaved, 4-row groups
  // gathered per 128-bit lane, then the lanes swapped across the two halves.
  static void transpose(const float* src, size_t src_stride, float* dst, size_t dst_stride) {
    __m256 r[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
    for (int i = 0; i < 8; i += 2) {
      const __m256 lo = _mm256_unpacklo_ps(r[i], r[i + 1]), hi = _mm256_unpackhi_ps(r[i], r[i + 1]);
      r[i] = lo, r[i + 1] = hi;
    }
    for (int g = 0; g < 8; g += 4) {  // lane L of u[g + k]: column 4L + k of rows g .. g+3
      u[g + 0] = _mm256_shuffle_ps(r[g], r[g + 2], 0x44), u[g + 1] = _mm256_shuffle_ps(r[g], r[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(r[g + 1], r[g + 3], 0x44), u[g + 3] = _mm256_shuffle_ps(r[g + 1], r[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(dst + k * dst_stride, _mm256_permute2f128_ps(u[k], u[4 + k], 0x20));
      _mm256_storeu_ps(dst + (4 + k) * dst_stride, _mm256_permute2f128_ps(u[k], u[4 + k], 0x31));
    }
  }
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static F u8_to_f(__m128i eight_bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight_bytes)); }
  static F i8_to_f(__m128i eight_bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_bytes)); }
  // FP8 bytes widened to 16 bits -> the fp16 bits that hold their values exactly (codecs/fp8/codec_fp8.cuh's widening):
  // e5m2 is fp16's top byte; e4m3 is sign | (b & 0x7f) << 7, worth 2^-8 of its value (fp8_scale), NaN codes kept NaN.
  template <RowFormat Fmt>
  static __m256i fp8_to_fp16(__m256i w) {
    if constexpr (Fmt == RowFormat::kFp8E5m2) {
      return _mm256_slli_epi16(w, 8);
    } else {
      const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                        _mm256_slli_epi16(mag, 7));
      const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f));
      return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
    }
  }
  template <RowFormat Fmt>
  static F fp8_scale(F x) {
    if constexpr (Fmt == RowFormat::kFp8E4m3) return _mm256_mul_ps(x, _mm256_set1_ps(256.f));
    return x;
  }
  // The loops over out[] are unrolled (KVQ_UNROLL): rolled, they store out[] to the stack for the caller to reload.
  template <RowFormat Fmt>
  static void unit(const uint8_t* p, F* out) {
    if constexpr (Fmt == RowFormat::kBf16) {
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k)));
        out[k] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      }
    } else if constexpr (Fmt == RowFormat::kF16) {
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k) out[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k)));
    } else if constexpr (Fmt == RowFormat::kFp8E4m3 || Fmt == RowFormat::kFp8E5m2) {
      KVQ_UNROLL
      for (int k = 0; k < 2; ++k) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
        const __m256i h = fp8_to_fp16<Fmt>(_mm256_cvtepu8_epi16(b));
        out[2 * k] = fp8_scale<Fmt>(_mm256_cvtph_ps(_mm256_castsi256_si128(h)));
        out[2 * k + 1] = fp8_scale<Fmt>(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
      }
    } else if constexpr (Fmt == RowFormat::kInt2) {
      int64_t x;
      std::memcpy(&x, p, 8);
      __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x(x), _mm256_setr_epi64x(0, 2, 4, 6));
      v = _mm256_and_si256(v, _mm256_set1_epi8(3));  // 64-bit lane k = values 8k .. 8k+7
      const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
      out[0] = u8_to_f(lo);
      out[1] = u8_to_f(_mm_unpackhi_epi64(lo, lo));
      out[2] = u8_to_f(hi);
      out[3] = u8_to_f(_mm_unpackhi_epi64(hi, hi));
    } else if constexpr (Fmt == RowFormat::kInt4) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
      out[0] = u8_to_f(lo);
      out[1] = u8_to_f(_mm_unpackhi_epi64(lo, lo));
      out[2] = u8_to_f(hi);
      out[3] = u8_to_f(_mm_unpackhi_epi64(hi, hi));
    } else {
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k) out[k] = u8_to_f(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k)));
    }
  }
  template <RowFormat Fmt>
  static void block(const uint8_t* p, F* out) {
    __m128i lo, hi;
    block_levels_i8<Fmt>(p, lo, hi);
    out[0] = i8_to_f(lo);
    out[1] = i8_to_f(_mm_unpackhi_epi64(lo, lo));
    out[2] = i8_to_f(hi);
    out[3] = i8_to_f(_mm_unpackhi_epi64(hi, hi));
  }
};

// The exact rotation (simd_rotate_impl.h): 4 doubles a vector; blocks of 3 rows × 8 columns (6 sums, 8 tile vectors).
struct DAvx2 {
  using V = __m256d;
  static constexpr int kW = 4, kCols = 2, kRows = 3;
  static V zero() { return _mm256_setzero_pd(); }
  static V bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static void store(float* p, V v) { _mm_storeu_ps(p, _mm256_cvtpd_ps(v)); }
  static void tile(const float* R, int d, int a0, int b0, V* t) {
    for (int j = 0; j < 4; ++j) t[j] = _mm256_cvtps_pd(_mm_loadu_ps(R + size_t(a0 + j) * d + b0));
  }
  static void tile_t(const float* R, int d, int a0, int b0, V* t) {
    __m128 r[4];
    for (int j = 0; j < 4; ++j) r[j] = _mm_loadu_ps(R + size_t(b0 + j) * d + a0);
    _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
    for (int j = 0; j < 4; ++j) t[j] = _mm256_cvtps_pd(r[j]);
  }
};

#include "simd/simd_kernels_impl.h"
#include "simd/simd_gemv_impl.h"
#include "simd/simd_rotate_impl.h"
#include "simd/simd_softmax_impl.h"

}  // namespace

// The int formats take the integer kernels of simd_avx2_int.cpp; bf16, f16 and llama.cpp's blocks the float ones.
RowKernels row_kernels_avx2(RowFormat format) {
  if (format == RowFormat::kInt2 || format == RowFormat::kInt4 || format == RowFormat::kInt8)
    return row_kernels_avx2_int(format);
  return row_kernels_for<VAvx2>(format);
}
SoftmaxKernels softmax_kernels_avx2() { return softmax_kernels_for<VAvx2>(); }
Bf16Gemv bf16_gemv_avx2() { return {2 * VAvx2::kW, bf16_gemv_for<VAvx2>}; }
void rotate_rows_avx2(float* const* rows, int n_rows, const float* R, int d, bool transpose) {
  rotate_rows_for<DAvx2>(rows, n_rows, R, d, transpose);
}

}  // namespace kvq

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
#include "common/error.h"
namespace kvq {
RowKernels row_kernels_avx2(RowFormat) { KVQ_FAIL("AVX2 kernels are not built for this architecture"); }
Bf16Gemv bf16_gemv_avx2() { KVQ_FAIL("AVX2 kernels are not built for this architecture"); }
SoftmaxKernels softmax_kernels_avx2() { KVQ_FAIL("AVX2 kernels are not built for this architecture"); }
void rotate_rows_avx2(float* const*, int, const float*, int, bool) {
  KVQ_FAIL("AVX2 kernels are not built for this architecture");
}
}  // namespace kvq
#endif
