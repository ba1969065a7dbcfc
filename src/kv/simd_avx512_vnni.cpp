// AVX-512 VNNI row kernels for the int formats (int2 / int4 / int8): integer dot products with vpdpwssd.
// The float operand is quantized to int16 first (q per query and group, scaled to ±32767; the weights
// w = p·scale per query, group and 32-token tile likewise), the unsigned codes are widened to int16, and
// vpdpwssd does 32 multiply-adds per instruction into int32 lanes; scale and zero are applied once per
// group (scores) or once per tile (accumulate). The result differs from the float kernels only by the
// int16 rounding of q / w (relative 2^-16 of the largest element of the group / tile).
// bf16 rows at this level use the plain AVX-512 float kernels.
// Compiled for its target by the pragma below; called only when simd_level_supported(kAvx512Vnni).
#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "common/half.h"
#include "kv/layout.h"
#include "kv/simd.h"

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_* operands
#endif

namespace kvq {
namespace {

#include "kv/simd_kernels_impl.h"  // tile sizes and helpers (its float templates are not instantiated here)

constexpr int kQ16Stride = 256;  // int16 query row stride (d <= 256)

// 32 codes of one packed unit as int16, in value order.
template <RowFormat Fmt>
inline __m512i unit_i16(const uint8_t* p) {
  if constexpr (Fmt == RowFormat::kInt2) {
    int64_t x;
    std::memcpy(&x, p, 8);
    __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x(x), _mm256_setr_epi64x(0, 2, 4, 6));
    return _mm512_cvtepu8_epi16(_mm256_and_si256(v, _mm256_set1_epi8(3)));
  } else if constexpr (Fmt == RowFormat::kInt4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(x, m)),
                                              _mm_and_si128(_mm_srli_epi16(x, 4), m), 1);
    return _mm512_cvtepu8_epi16(v);
  } else {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// Quantize one group of n (a multiple of 16) floats to int16 with step max|x| / 32767 (step 1 for an all-zero
// group), rounding x / step to nearest even (|x / step| <= 32767 by construction); sum gets Σx. Runs once per query and group per call,
// i.e. per cache page in attention, so its cost matters next to the 128-row kernels.
inline float quantize_group_i16(const float* x, int n, int16_t* out, float& sum) {
  __m512 m = _mm512_setzero_ps(), s = _mm512_setzero_ps();
  for (int k = 0; k < n; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    m = _mm512_max_ps(m, _mm512_abs_ps(v));
    s = _mm512_add_ps(s, v);
  }
  const float mx = _mm512_reduce_max_ps(m);
  sum = _mm512_reduce_add_ps(s);
  const float step = mx > 0.f ? mx / 32767.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / step);
  for (int k = 0; k < n; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                        _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv))));
  return step;
}

// Horizontal sums of 4 int32 vectors: [Σa, Σb, Σc, Σd]. (|lane| <= 255 · 32767 · 8, so no overflow.)
inline __m128i hsum4_epi32(const __m512i* v) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Scores of rows [t0, t0+nt) for QB queries (QB = 1, 2 or a multiple of 4). Integer sums per group,
// reduced four queries at a time, then s = Σ_g scale_g·qstep_g·isum_g - Σ_g scale_g·zero_g·Σq_g.
template <RowFormat Fmt, int QB>
void scores_block_i16(const RowsView& r, int t0, int nt, const int16_t* q16, const float (*qstep)[kMaxGroups],
                      const float (*qsum)[kMaxGroups], float* s, size_t s_stride) {
  constexpr int kUB = fmt_unit_bytes<Fmt>(), kQ4 = QB >= 4 ? QB / 4 : 1;
  const int d = r.d, upg = r.group / 32, ng = d / r.group;
  __m128 qstep4[kQ4][kMaxGroups], qsum4[kQ4][kMaxGroups];  // queries 4j .. 4j+3 (missing ones 0)
  for (int j = 0; j < kQ4; ++j)
    for (int g = 0; g < ng; ++g) {
      float a[4] = {}, b[4] = {};
      for (int k = 0; k < 4 && 4 * j + k < QB; ++k) a[k] = qstep[4 * j + k][g], b[k] = qsum[4 * j + k][g];
      qstep4[j][g] = _mm_loadu_ps(a), qsum4[j][g] = _mm_loadu_ps(b);
    }
  float buf[QB][kTileRows];  // the tile's scores, written out row by row at the end (4K aliasing)
  for (int t = t0; t < t0 + nt; ++t) {
    const uint8_t* row = r.rows + size_t(t) * r.row_stride;
    const uint8_t* codes = row + r.codes_offset;
    prefetch_row(r, t + kPrefetchRows);
    __m128 tot4[kQ4], zt4[kQ4];
    KVQ_UNROLL
    for (int j = 0; j < kQ4; ++j) tot4[j] = _mm_setzero_ps(), zt4[j] = _mm_setzero_ps();
    for (int g = 0; g < ng; ++g) {
      __m512i acc[kQ4 * 4];
      KVQ_UNROLL
      for (int i = 0; i < kQ4 * 4; ++i) acc[i] = _mm512_setzero_si512();
      for (int u = g * upg; u < (g + 1) * upg; ++u) {
        const __m512i x = unit_i16<Fmt>(codes + u * kUB);
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i)
          acc[i] = _mm512_dpwssd_epi32(acc[i], x, _mm512_loadu_si512(q16 + i * kQ16Stride + u * 32));
      }
      float sc = 1.f, zr = 0.f;
      if (r.grouped) {
        const layout::GroupParams gp = row_params(row, g);
        sc = _cvtsh_ss(gp.scale), zr = _cvtsh_ss(gp.zero);
      }
      const __m128 scv = _mm_set1_ps(sc), szv = _mm_set1_ps(sc * zr);
      KVQ_UNROLL
      for (int j = 0; j < kQ4; ++j) {
        const __m128i h = hsum4_epi32(&acc[4 * j]);
        tot4[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(h), _mm_mul_ps(scv, qstep4[j][g]), tot4[j]);
        zt4[j] = _mm_fmadd_ps(szv, qsum4[j][g], zt4[j]);
      }
    }
    KVQ_UNROLL
    for (int j = 0; j < kQ4; ++j) {
      float out[4];
      _mm_storeu_ps(out, _mm_sub_ps(tot4[j], zt4[j]));
      for (int k = 0; k < 4 && 4 * j + k < QB; ++k) buf[4 * j + k][t - t0] = out[k];
    }
  }
  for (int i = 0; i < QB; ++i) std::memcpy(s + i * s_stride + t0, buf[i], sizeof(float) * size_t(nt));
}

template <RowFormat Fmt>
void scores_vnni(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  const int d = r.d, ng = d / r.group;
  alignas(64) int16_t q16[kChunkQ * kQ16Stride];
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    float qsum[kChunkQ][kMaxGroups] = {}, qstep[kChunkQ][kMaxGroups];
    for (int i = 0; i < nc; ++i)
      for (int g = 0; g < ng; ++g) {
        const float* qg = q + size_t(c0 + i) * d + g * r.group;
        qstep[i][g] = quantize_group_i16(qg, r.group, q16 + i * kQ16Stride + g * r.group, qsum[i][g]);
      }
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int i0 = 0; i0 < nc;) {
        const int qb = pick_block(nc - i0, 8);
        const int16_t* qi = q16 + i0 * kQ16Stride;
        float* si = s + size_t(c0 + i0) * s_stride;
        switch (qb) {
          case 8: scores_block_i16<Fmt, 8>(r, t0, nt, qi, qstep + i0, qsum + i0, si, s_stride); break;
          case 4: scores_block_i16<Fmt, 4>(r, t0, nt, qi, qstep + i0, qsum + i0, si, s_stride); break;
          case 2: scores_block_i16<Fmt, 2>(r, t0, nt, qi, qstep + i0, qsum + i0, si, s_stride); break;
          default: scores_block_i16<Fmt, 1>(r, t0, nt, qi, qstep + i0, qsum + i0, si, s_stride); break;
        }
        i0 += qb;
      }
    }
  }
}

// acc[i, :] += wstep[i][g] · Σ_t w16[i][g][t] · code_t over rows [t0, t0 + nt). Two tokens per int32 lane:
// read as uint32, w16[i][g][2·pr .. 2·pr + 1] packs the int16 weights of tokens 2·pr (low) and 2·pr + 1 (high).
template <RowFormat Fmt, int QB>
void accumulate_block_i16(const RowsView& r, int t0, int nt, const int16_t (*w16)[kMaxGroups][kTileRows],
                          const float (*wstep)[kMaxGroups], float* acc) {
  constexpr int kUB = fmt_unit_bytes<Fmt>();
  const int d = r.d, upg = r.group / 32;
  // unpacklo/hi_epi16 of two tokens' codes put channels {0-3, 8-11, 16-19, 24-27} in `lo` and
  // {4-7, 12-15, 20-23, 28-31} in `hi`; these indices restore channel order (0-15, then 16-31).
  const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i idx1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int u = 0; u < d / 32; ++u) {
    const int g = u / upg;
    __m512i lo[QB], hi[QB];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) lo[i] = _mm512_setzero_si512(), hi[i] = _mm512_setzero_si512();
    const uint8_t* codes = r.rows + size_t(t0) * r.row_stride + r.codes_offset + u * kUB;
    for (int pr = 0; 2 * pr < nt; ++pr) {
      prefetch_unit(r, t0 + 2 * pr + kPrefetchTiles * kTileRows, u * kUB);
      prefetch_unit(r, t0 + 2 * pr + 1 + kPrefetchTiles * kTileRows, u * kUB);
      const __m512i a = unit_i16<Fmt>(codes + size_t(2 * pr) * r.row_stride);
      const __m512i b =
          2 * pr + 1 < nt ? unit_i16<Fmt>(codes + size_t(2 * pr + 1) * r.row_stride) : _mm512_setzero_si512();
      const __m512i il = _mm512_unpacklo_epi16(a, b), ih = _mm512_unpackhi_epi16(a, b);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        int32_t pair;
        std::memcpy(&pair, &w16[i][g][2 * pr], 4);
        const __m512i wv = _mm512_set1_epi32(pair);
        lo[i] = _mm512_dpwssd_epi32(lo[i], il, wv);
        hi[i] = _mm512_dpwssd_epi32(hi[i], ih, wv);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) {
      const __m512 f = _mm512_set1_ps(wstep[i][g]);
      float* out = acc + i * d + u * 32;
      const __m512 c0 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo[i], idx0, hi[i]));
      const __m512 c1 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo[i], idx1, hi[i]));
      _mm512_storeu_ps(out, _mm512_fmadd_ps(c0, f, _mm512_loadu_ps(out)));
      _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(c1, f, _mm512_loadu_ps(out + 16)));
    }
  }
}

template <RowFormat Fmt>
void accumulate_vnni(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  const int d = r.d, ng = d / r.group;
  static_assert(kTileRows == 32, "one tile = two vectors of 16 weights");
  static_assert(kTileRows * 255 * 32767.0 < 2147483647.0, "int32 lanes must not overflow within a tile");
  alignas(64) float sc[kMaxGroups][kTileRows], zr[kMaxGroups][kTileRows];  // per group and token of the tile
  alignas(64) int16_t w16[kChunkQ][kMaxGroups][kTileRows];
  float wstep[kChunkQ][kMaxGroups];
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    double zsum[kChunkQ][kMaxGroups] = {};
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int t = 0; t < kTileRows; ++t) {
        const uint8_t* row = r.rows + size_t(t0 + t) * r.row_stride;
        for (int g = 0; g < ng; ++g) {
          sc[g][t] = 1.f, zr[g][t] = 0.f;
          if (t >= nt) {
            sc[g][t] = 0.f;
          } else if (r.grouped) {
            const layout::GroupParams gp = row_params(row, g);
            sc[g][t] = _cvtsh_ss(gp.scale), zr[g][t] = _cvtsh_ss(gp.zero);
          }
        }
      }
      const __mmask16 m0 = nt >= 16 ? __mmask16(0xffff) : __mmask16((1u << nt) - 1);
      const __mmask16 m1 = nt >= 32 ? __mmask16(0xffff) : nt <= 16 ? __mmask16(0) : __mmask16((1u << (nt - 16)) - 1);
      for (int i = 0; i < nc; ++i) {
        const float* pi = p + size_t(c0 + i) * p_stride + t0;
        const __m512 p0 = _mm512_maskz_loadu_ps(m0, pi), p1 = _mm512_maskz_loadu_ps(m1, pi + 16);
        for (int g = 0; g < ng; ++g) {
          // w = p·scale for the tile's tokens, rounded to int16 with step max|w| / 32767
          const __m512 w0 = _mm512_mul_ps(p0, _mm512_load_ps(sc[g])), w1 = _mm512_mul_ps(p1, _mm512_load_ps(sc[g] + 16));
          const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(w0), _mm512_abs_ps(w1)));
          const float step = m > 0.f ? m / 32767.f : 1.f;
          const __m512 inv = _mm512_set1_ps(1.f / step);
          const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, inv)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, inv));
          _mm256_store_si256(reinterpret_cast<__m256i*>(&w16[i][g][0]), _mm512_cvtsepi32_epi16(i0));
          _mm256_store_si256(reinterpret_cast<__m256i*>(&w16[i][g][16]), _mm512_cvtsepi32_epi16(i1));
          wstep[i][g] = step;
          if (r.grouped) {  // the zero term with the same (rounded) weights the codes get
            const __m512 z = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_load_ps(zr[g]),
                                             _mm512_mul_ps(_mm512_cvtepi32_ps(i1), _mm512_load_ps(zr[g] + 16)));
            zsum[i][g] += double(_mm512_reduce_add_ps(z)) * step;
          }
        }
      }
      for (int i0 = 0; i0 < nc;) {
        const int qb = pick_block(nc - i0, 8);
        float* ai = acc + size_t(c0 + i0) * d;
        switch (qb) {
          case 8: accumulate_block_i16<Fmt, 8>(r, t0, nt, w16 + i0, wstep + i0, ai); break;
          case 4: accumulate_block_i16<Fmt, 4>(r, t0, nt, w16 + i0, wstep + i0, ai); break;
          case 2: accumulate_block_i16<Fmt, 2>(r, t0, nt, w16 + i0, wstep + i0, ai); break;
          default: accumulate_block_i16<Fmt, 1>(r, t0, nt, w16 + i0, wstep + i0, ai); break;
        }
        i0 += qb;
      }
    }
    if (r.grouped)  // vectorized: this runs once per call (per cache page in attention)
      for (int i = 0; i < nc; ++i)
        for (int g = 0; g < ng; ++g) {
          const __m512 z = _mm512_set1_ps(float(zsum[i][g]));
          float* a = acc + size_t(c0 + i) * d + g * r.group;
          for (int c = 0; c < r.group; c += 16) _mm512_storeu_ps(a + c, _mm512_sub_ps(_mm512_loadu_ps(a + c), z));
        }
  }
}

}  // namespace

RowKernels row_kernels_avx512_vnni(RowFormat format) {
  switch (format) {
    case RowFormat::kInt2: return {scores_vnni<RowFormat::kInt2>, accumulate_vnni<RowFormat::kInt2>};
    case RowFormat::kInt4: return {scores_vnni<RowFormat::kInt4>, accumulate_vnni<RowFormat::kInt4>};
    case RowFormat::kInt8: return {scores_vnni<RowFormat::kInt8>, accumulate_vnni<RowFormat::kInt8>};
    case RowFormat::kBf16: break;
  }
  return row_kernels_avx512(format);
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
RowKernels row_kernels_avx512_vnni(RowFormat) { KVQ_FAIL("AVX-512 VNNI kernels are not built for this architecture"); }
}  // namespace kvq
#endif
