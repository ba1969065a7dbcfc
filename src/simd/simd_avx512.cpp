// AVX-512 (F/BW/VL/DQ) + FMA + F16C row kernels and softmax primitives (16 floats per vector). Compiled for that
// target by the pragma below, called only when simd_level_supported(kAvx512). Every header is included BEFORE the
// pragma so that no inline function shared with other files is compiled for AVX-512.
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
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
// GCC 12 flags the _mm512_undefined_* passthrough operands of the conversion and min / max intrinsics (false
// positive).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace kvq {
namespace {

#include "codecs/llamacpp/simd_blocks_x86.h"

struct VAvx512 {
  using F = __m512;
  static constexpr int kW = 16, kMaxQBScores = 8, kMaxQBAcc = 8;  // 32 zmm registers
  static constexpr int kScoreChains = 2, kMaxQBRowScores = 8;       // 16 sums + a unit's 2 vectors
  // The bf16 decode-step product (simd_gemv_impl.h): 2 rows × 6 queries (24 sums), 4 rows for one or two queries.
  static constexpr int kGemvRows = 2, kGemvQB = 6, kGemvRowsFew = 4;
  static void bf16_pairs(const uint8_t* p, F& even, F& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
  static F zero() { return _mm512_setzero_ps(); }
  static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F bcast(float x) { return _mm512_set1_ps(x); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F exp2i(F n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static F zero_below(F x, F lo, F y) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y); }
  static F load_partial(const float* p, int n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), __mmask16((1u << n) - 1), p);
  }
  static void store_partial(float* p, F v, int n) { _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), v); }
  static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  static float hsum(F v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void hsum4(const F* v, float* out) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
  // dst[j·dst_stride + i] = src[i·src_stride + j] for a 16 × 16 block: pairs of rows interleaved, then 4-row groups
  // gathered per 128-bit lane, then the 4 × 4 transpose of the lanes.
  static void transpose(const float* src, size_t src_stride, float* dst, size_t dst_stride) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_stride);
    for (int i = 0; i < 16; i += 2) {  // lane L of t[i] / t[i+1]: columns 4L, 4L+1 / 4L+2, 4L+3 of rows i, i+1
      const __m512 lo = _mm512_unpacklo_ps(r[i], r[i + 1]), hi = _mm512_unpackhi_ps(r[i], r[i + 1]);
      r[i] = lo, r[i + 1] = hi;
    }
    for (int g = 0; g < 16; g += 4) {  // lane L of u[g + k]: column 4L + k of rows g .. g+3
      u[g + 0] = _mm512_shuffle_ps(r[g], r[g + 2], 0x44), u[g + 1] = _mm512_shuffle_ps(r[g], r[g + 2], 0xEE);
      u[g + 2] = _mm512_shuffle_ps(r[g + 1], r[g + 3], 0x44), u[g + 3] = _mm512_shuffle_ps(r[g + 1], r[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {  // column 4L + k = lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
      const __m512 x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
      const __m512 y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44),
                   y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
      _mm512_storeu_ps(dst + (0 + k) * dst_stride, _mm512_shuffle_f32x4(x0, y0, 0x88));
      _mm512_storeu_ps(dst + (4 + k) * dst_stride, _mm512_shuffle_f32x4(x0, y0, 0xDD));
      _mm512_storeu_ps(dst + (8 + k) * dst_stride, _mm512_shuffle_f32x4(x1, y1, 0x88));
      _mm512_storeu_ps(dst + (12 + k) * dst_stride, _mm512_shuffle_f32x4(x1, y1, 0xDD));
    }
  }
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static F u8_to_f(__m128i sixteen_bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sixteen_bytes)); }
  static F i8_to_f(__m128i sixteen_bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen_bytes)); }
  // FP8 bytes widened to 16 bits -> the fp16 bits that hold their values exactly (codecs/fp8/codec_fp8.cuh's widening):
  // e5m2 is fp16's top byte; e4m3 is sign | (b & 0x7f) << 7, worth 2^-8 of its value (fp8_scale), NaN codes kept NaN.
  template <RowFormat Fmt>
  static __m512i fp8_to_fp16(__m512i w) {
    if constexpr (Fmt == RowFormat::kFp8E5m2) {
      return _mm512_slli_epi16(w, 8);
    } else {
      const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
      const __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8),
                                        _mm512_slli_epi16(mag, 7));
      const __mmask32 nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7f));
      return _mm512_mask_mov_epi16(h, nan, _mm512_or_si512(h, _mm512_set1_epi16(0x7e00)));
    }
  }
  template <RowFormat Fmt>
  static F fp8_scale(F x) {
    if constexpr (Fmt == RowFormat::kFp8E4m3) return _mm512_mul_ps(x, _mm512_set1_ps(256.f));
    return x;
  }
  // The loops over out[] are unrolled (KVQ_UNROLL): rolled, they store out[] to the stack for the caller to reload.
  template <RowFormat Fmt>
  static void unit(const uint8_t* p, F* out) {
    if constexpr (Fmt == RowFormat::kBf16) {
      KVQ_UNROLL
      for (int k = 0; k < 2; ++k) {
        const __m512i w =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k)));
        out[k] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      }
    } else if constexpr (Fmt == RowFormat::kF16) {
      KVQ_UNROLL
      for (int k = 0; k < 2; ++k)
        out[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k)));
    } else if constexpr (Fmt == RowFormat::kFp8E4m3 || Fmt == RowFormat::kFp8E5m2) {
      const __m512i h = fp8_to_fp16<Fmt>(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
      out[0] = fp8_scale<Fmt>(_mm512_cvtph_ps(_mm512_castsi512_si256(h)));
      out[1] = fp8_scale<Fmt>(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
    } else if constexpr (Fmt == RowFormat::kInt2) {
      int64_t x;
      std::memcpy(&x, p, 8);
      __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x(x), _mm256_setr_epi64x(0, 2, 4, 6));
      v = _mm256_and_si256(v, _mm256_set1_epi8(3));  // 64-bit lane k = values 8k .. 8k+7
      out[0] = u8_to_f(_mm256_castsi256_si128(v));
      out[1] = u8_to_f(_mm256_extracti128_si256(v, 1));
    } else if constexpr (Fmt == RowFormat::kInt4) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_set1_epi8(0x0f);
      out[0] = u8_to_f(_mm_and_si128(x, m));
      out[1] = u8_to_f(_mm_and_si128(_mm_srli_epi16(x, 4), m));
    } else {
      out[0] = u8_to_f(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      out[1] = u8_to_f(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    }
  }
  template <RowFormat Fmt>
  static void block(const uint8_t* p, F* out) {
    __m128i lo, hi;
    block_levels_i8<Fmt>(p, lo, hi);
    out[0] = i8_to_f(lo);
    out[1] = i8_to_f(hi);
  }
};

// The exact rotation (simd_rotate_impl.h): 8 doubles a vector; blocks of 4 rows × 16 columns (8 sums, 16 tile
// vectors).
struct DAvx512 {
  using V = __m512d;
  static constexpr int kW = 8, kCols = 2, kRows = 4;
  static V zero() { return _mm512_setzero_pd(); }
  static V bcast(const double* p) { return _mm512_set1_pd(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(v)); }
  static void tile(const float* R, int d, int a0, int b0, V* t) {
    for (int j = 0; j < 8; ++j) t[j] = _mm512_cvtps_pd(_mm256_loadu_ps(R + size_t(a0 + j) * d + b0));
  }
  // The 8 × 8 block R[b0 .. b0+8)[a0 .. a0+8) transposed in registers (as VAvx2::transpose), then widened.
  static void tile_t(const float* R, int d, int a0, int b0, V* t) {
    __m256 r[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(R + size_t(b0 + i) * d + a0);
    for (int i = 0; i < 8; i += 2) {
      const __m256 lo = _mm256_unpacklo_ps(r[i], r[i + 1]), hi = _mm256_unpackhi_ps(r[i], r[i + 1]);
      r[i] = lo, r[i + 1] = hi;
    }
    for (int g = 0; g < 8; g += 4) {
      u[g + 0] = _mm256_shuffle_ps(r[g], r[g + 2], 0x44), u[g + 1] = _mm256_shuffle_ps(r[g], r[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(r[g + 1], r[g + 3], 0x44), u[g + 3] = _mm256_shuffle_ps(r[g + 1], r[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      t[k] = _mm512_cvtps_pd(_mm256_permute2f128_ps(u[k], u[4 + k], 0x20));
      t[4 + k] = _mm512_cvtps_pd(_mm256_permute2f128_ps(u[k], u[4 + k], 0x31));
    }
  }
};

#include "simd/simd_kernels_impl.h"
#include "simd/simd_gemv_impl.h"
#include "simd/simd_rotate_impl.h"
#include "simd/simd_softmax_impl.h"

}  // namespace

RowKernels row_kernels_avx512(RowFormat format) { return row_kernels_for<VAvx512>(format); }
SoftmaxKernels softmax_kernels_avx512() { return softmax_kernels_for<VAvx512>(); }
Bf16Gemv bf16_gemv_avx512() { return {2 * VAvx512::kW, bf16_gemv_for<VAvx512>}; }
void rotate_rows_avx512(float* const* rows, int n_rows, const float* R, int d, bool transpose) {
  rotate_rows_for<DAvx512>(rows, n_rows, R, d, transpose);
}

}  // namespace kvq

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#else
#include "common/error.h"
namespace kvq {
RowKernels row_kernels_avx512(RowFormat) { KVQ_FAIL("AVX-512 kernels are not built for this architecture"); }
Bf16Gemv bf16_gemv_avx512() { KVQ_FAIL("AVX-512 kernels are not built for this architecture"); }
SoftmaxKernels softmax_kernels_avx512() { KVQ_FAIL("AVX-512 kernels are not built for this architecture"); }
void rotate_rows_avx512(float* const*, int, const float*, int, bool) {
  KVQ_FAIL("AVX-512 kernels are not built for this architecture");
}
}  // namespace kvq
#endif
