// AVX-512 VNNI (+VBMI) row kernels for the int formats (int2 / int4 / int8): integer dot products.
// The float operand is quantized to int16 first (q per query and group, scaled to ±32767; the weights
// w = p·scale per query, group and 32-token tile likewise), the unsigned codes are widened to int16, and
// vpdpwssd does 32 multiply-adds per instruction into int32 lanes; scale and zero are applied once per
// group (scores) or once per tile (accumulate). The result differs from the float kernels only by the
// int16 rounding of q / w (relative 2^-16 of the largest element of the group / tile).
// int2 rows of one 128-value group (the default cache) take a faster path: q and w rounded to int8 and vpdpbusd
// on bit planes of the packed codes (64 multiply-adds per instruction, no widening; see below). Its rounding
// (1/254 of the largest element) adds +0.01% ppl on models/ref at 2K with 64/256 windows and Hadamard, +0.14%
// with no windows and no rotation — small beside int2's own cost, and measured in tests/test_cache_attention.cpp.
// bf16 rows at this level use the plain AVX-512 float kernels.
// Compiled for its target by the pragma below; called only when simd_level_supported(kAvx512Vnni).
#include <array>
#include <cmath>
#include <cstring>


#include "codecs/layout.h"
#include "codecs/llamacpp/llamacpp_blocks.h"
#include "common/half.h"
#include "simd/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")
#endif
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_* operands
#endif

namespace kvq {
namespace {

#include "simd/simd_kernels_impl.h"  // tile sizes and helpers (its float templates are not instantiated here)

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

// Quantize one group of n (a multiple of 16) floats to int16 with step max|x| / 32767 (step 1 for an all-zero group),
// rounding x / step to nearest even (|x / step| <= 32767 by construction); sum gets Σx. Runs once per query and group
// per call, i.e. per cache page in attention, so its cost matters next to the 128-row kernels.
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

// ---- int16 kernels (every int row but int2 at G = d): simd_int16_impl.h over these traits ----
struct IVnni {
  using Unit = __m512i;  // the unit's 32 codes
  using Acc = __m512i;
  static constexpr int kScoresQB = 8, kAccQB = 8;  // 32 zmm registers
  template <RowFormat Fmt>
  static Unit unit(const uint8_t* p) { return unit_i16<Fmt>(p); }
  static Acc zero() { return _mm512_setzero_si512(); }
  static Unit no_unit() { return _mm512_setzero_si512(); }
  static Acc dot(Acc acc, Unit x, const int16_t* q) { return _mm512_dpwssd_epi32(acc, x, _mm512_loadu_si512(q)); }
  static Acc madd(Acc acc, Acc x, Acc w) { return _mm512_dpwssd_epi32(acc, x, w); }
  static Acc bcast32(int32_t v) { return _mm512_set1_epi32(v); }
  // unpacklo / unpackhi of two tokens' codes: channels {0-3, 8-11, 16-19, 24-27} in out[0], {4-7, 12-15, 20-23,
  // 28-31} in out[1].
  static constexpr int kPairVectors = 2;
  static void pairs(Unit x, Unit y, Acc* out) {
    out[0] = _mm512_unpacklo_epi16(x, y), out[1] = _mm512_unpackhi_epi16(x, y);
  }
  static void add_channels(const Acc* sums, float f, float* out) {
    const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);  // channels 0-15
    const __m512i idx1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512 fv = _mm512_set1_ps(f);
    const __m512 c0 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(sums[0], idx0, sums[1]));
    const __m512 c1 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(sums[0], idx1, sums[1]));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(c0, fv, _mm512_loadu_ps(out)));
    _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(c1, fv, _mm512_loadu_ps(out + 16)));
  }
  static __m128i hsum4(const Acc* v) { return hsum4_epi32(v); }
  static float quantize(const float* x, int n, int16_t* out, float& sum) { return quantize_group_i16(x, n, out, sum); }
  static void subtract(float* a, int n, float z) {
    const __m512 zv = _mm512_set1_ps(z);
    for (int c = 0; c < n; c += 16) _mm512_storeu_ps(a + c, _mm512_sub_ps(_mm512_loadu_ps(a + c), zv));
  }
  // w = pt · sc for one tile, rounded to int16 with step max|w| / 32767.
  static float tile_weights(const float* pt, const float* sc, const float* zr, int16_t* w16, float& zdot) {
    const __m512 w0 = _mm512_mul_ps(_mm512_load_ps(pt), _mm512_load_ps(sc)),
                 w1 = _mm512_mul_ps(_mm512_load_ps(pt + 16), _mm512_load_ps(sc + 16));
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(w0), _mm512_abs_ps(w1)));
    const float step = m > 0.f ? m / 32767.f : 1.f;
    const __m512 inv = _mm512_set1_ps(1.f / step);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, inv)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, inv));
    _mm256_store_si256(reinterpret_cast<__m256i*>(w16), _mm512_cvtsepi32_epi16(i0));
    _mm256_store_si256(reinterpret_cast<__m256i*>(w16 + 16), _mm512_cvtsepi32_epi16(i1));
    const __m512 z = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_load_ps(zr),
                                     _mm512_mul_ps(_mm512_cvtepi32_ps(i1), _mm512_load_ps(zr + 16)));
    zdot = _mm512_reduce_add_ps(z);
    return step;
  }
};

#include "simd/simd_int16_impl.h"

// ---- int2 scores with one group per row (G = d, the default): int8 queries, vpdpbusd on bit planes ----
// A row's packed codes are d/4 bytes; byte 8u + j holds values 32u + j + 8k in bits 2k (layout.h). Plane k of
// 32 code bytes, (x >> 2k) & 3, is 32 unsigned codes; the matching query bytes are q8 at those positions, so
// vpdpbusd(plane_k, q8_k) summed over k = 0..3 leaves Σ q8 · code of a 128-value chunk in 8 int32 lanes — no
// widening, 64 multiply-adds per instruction. Two rows share a 512-bit vector (row t low, t + 1 high half).
// q is rounded to int8 with step max|q| / 127 (relative 1/254 of the largest element), and the zero term
// uses the same rounded q, so the result is exactly the float score of the rounded query:
//   s = scale · step · (Σ q8·code − zero · Σ q8).
constexpr int kPlaneQB = 4;         // queries per block (a GQA group of 4 fills it)
constexpr int kMaxPlaneChunks = 2;  // d <= 256

struct PlaneQuery {
  alignas(64) int8_t planes[kMaxPlaneChunks][4][32];  // [128-value chunk][plane k][byte b] = q8 at value 128c+32u+j+8k
  float step;                                          // q ≈ step · q8
  int32_t sum;                                         // Σ q8
};

inline void make_plane_query(const float* q, int d, PlaneQuery& out) {
  __m512 m = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(q + c)));
  const float mx = _mm512_reduce_max_ps(m);
  out.step = mx > 0.f ? mx / 127.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / out.step);
  alignas(64) int8_t q8[kMaxPlaneChunks * 128];
  __m512i sum = _mm512_setzero_si512();
  for (int c = 0; c < d; c += 16) {  // round to nearest even; |q / step| <= 127 by construction
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + c), inv));
    sum = _mm512_add_epi32(sum, v);
    _mm_store_si128(reinterpret_cast<__m128i*>(q8 + c), _mm512_cvtsepi32_epi8(v));
  }
  out.sum = _mm512_reduce_add_epi32(sum);
  // plane k of a chunk = the 8-value runs starting at 32u + 8k, u = 0..3
  for (int c = 0; c < d / 128; ++c)
    for (int k = 0; k < 4; ++k)
      for (int u = 0; u < 4; ++u) std::memcpy(&out.planes[c][k][8 * u], q8 + 128 * c + 32 * u + 8 * k, 8);
}

#include "simd/simd_int2_planes_impl.h"

// Rows t0 .. t0 + nt of QB queries. Per pair of rows, the QB accumulators are reduced together: after the
// unpack/add steps, 128-bit lane L holds [Σ acc_0 .. Σ acc_3] over lane quad L; lanes 0-1 belong to row t and
// lanes 2-3 to row t + 1 (an odd last row is paired with zero codes). The tile's integer sums are then scaled 8 rows
// at a time (simd_int2_planes_impl.h).
template <int QB>
void scores_planes_block(const RowsView& r, int t0, int nt, const PlaneQuery* pq, float* s, size_t s_stride) {
  const int chunks = r.d / 128;
  const __m512i m3 = _mm512_set1_epi8(3);
  __m512i qv[QB][kMaxPlaneChunks][4];
  KVQ_UNROLL
  for (int i = 0; i < QB; ++i)
    for (int c = 0; c < chunks; ++c)
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k)
        qv[i][c][k] = _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(pq[i].planes[c][k])));
  alignas(32) int32_t sums[kTileRows + 1][4];  // [row][query], one store per pair
  for (int t = 0; t < nt; t += 2) {
    const bool pair = t + 1 < nt;
    const uint8_t* ra = r.rows + size_t(t0 + t) * r.row_stride;
    const uint8_t* rb = ra + r.row_stride;
    prefetch_row(r, t0 + t + 2 * kPrefetchRows);  // this kernel outruns the float ones: look further ahead
    prefetch_row(r, t0 + t + 1 + 2 * kPrefetchRows);
    __m512i acc[4];
    KVQ_UNROLL
    for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_si512();
    for (int c = 0; c < chunks; ++c) {
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + r.codes_offset + 32 * c));
      const __m256i xb = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + r.codes_offset + 32 * c))
                              : _mm256_setzero_si256();
      const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(xa), xb, 1);
      const __m512i p[4] = {_mm512_and_si512(x, m3), _mm512_and_si512(_mm512_srli_epi16(x, 2), m3),
                            _mm512_and_si512(_mm512_srli_epi16(x, 4), m3), _mm512_and_si512(_mm512_srli_epi16(x, 6), m3)};
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i)
        KVQ_UNROLL
        for (int k = 0; k < 4; ++k) acc[i] = _mm512_dpbusd_epi32(acc[i], p[k], qv[i][c][k]);
    }
    const __m512i t0v = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]), _mm512_unpackhi_epi32(acc[0], acc[1]));
    const __m512i t1v = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]), _mm512_unpackhi_epi32(acc[2], acc[3]));
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0v, t1v), _mm512_unpackhi_epi64(t0v, t1v));
    u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));  // lane 0: row t, lane 2: row t + 1
    // [row t | row t + 1]: lanes 0 and 2
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums[t]),
                       _mm512_castsi512_si256(_mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 2, 2, 0))));
  }
  scale_plane_sums<QB>(r, t0, nt, sums, pq, s, s_stride);
}

void scores_int2_planes(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  PlaneQuery pq[kChunkQ];
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    for (int i = 0; i < nc; ++i) make_plane_query(q + size_t(c0 + i) * r.d, r.d, pq[i]);
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int i0 = 0; i0 < nc;) {
        const int qb = nc - i0 >= kPlaneQB ? kPlaneQB : nc - i0;
        float* si = s + size_t(c0 + i0) * s_stride;
        switch (qb) {
          case 4: scores_planes_block<4>(r, t0, nt, pq + i0, si, s_stride); break;
          case 3: scores_planes_block<3>(r, t0, nt, pq + i0, si, s_stride); break;
          case 2: scores_planes_block<2>(r, t0, nt, pq + i0, si, s_stride); break;
          default: scores_planes_block<1>(r, t0, nt, pq + i0, si, s_stride); break;
        }
        i0 += qb;
      }
    }
  }
}

// int2 scores: the plane kernel when the row is one group (G = d, d a multiple of 128), else int16 VNNI.
void scores_int2(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  if (r.grouped && r.group == r.d && r.d % 128 == 0 && r.d / 128 <= kMaxPlaneChunks)
    scores_int2_planes(r, q, n_q, s, s_stride);
  else
    scores_i16<IVnni, RowFormat::kInt2>(r, q, n_q, s, s_stride);
}

// ---- int2 accumulate with one group of 128 per row: int8 weights, vpdpbusd on bit planes of 4 tokens ----
// w = p · scale per token is rounded to int8 with one step per query and call (max|w| / 127). Four consecutive
// rows t..t+3 (36 bytes each: GroupParams + 32 code bytes) are 144 contiguous bytes; one vpermt2b over two
// 64-byte loads gathers byte m of their codes into dword m as [t, t+1, t+2, t+3] (16 bytes = channels
// 0-63; the same index from base + 16 gives channels 64-127). Plane k of that dword holds the codes of
// channel 32u + j + 8k (m = 8u + j) of the four tokens, and vpdpbusd with the four tokens' int8 weights
// adds Σ_t w8_t · code_t to its lane: 256 multiply-adds per instruction group, no widening, no reduction.
// The zero term Σ_t w8_t · zero_t is subtracted once per call; x̂ = (code − zero) · scale.
constexpr int kAccPlaneRows = 4 + 32;  // row bytes this kernel handles (G = d = 128)

// vpermt2b index over the 128 bytes from a group of four rows: output byte p = code byte p / 4 of row p % 4.
alignas(64) constexpr std::array<int8_t, 64> kAccPlaneIdx = [] {
  std::array<int8_t, 64> b{};
  for (int p = 0; p < 64; ++p) b[size_t(p)] = int8_t(kAccPlaneRows * (p % 4) + 4 + p / 4);
  return b;
}();

template <int QB>
void accumulate_planes_block(const RowsView& r, const int8_t* const* w8, const float* step, float* acc) {
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i idx = _mm512_load_si512(kAccPlaneIdx.data());
  const int n4 = (r.n_rows + 3) / 4;
  alignas(64) uint8_t tail[4 * kAccPlaneRows + 64] = {};  // the last, partial group of 4 rows, zero-padded
  if (r.n_rows % 4) std::memcpy(tail, r.rows + size_t(n4 - 1) * 4 * kAccPlaneRows, size_t(r.n_rows % 4) * kAccPlaneRows);
  for (int h = 0; h < 2; ++h) {  // channels 64h .. 64h + 63
    __m512i a[QB][4];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k) a[i][k] = _mm512_setzero_si512();
    for (int g4 = 0; g4 < n4; ++g4) {
      const bool full = 4 * g4 + 4 <= r.n_rows;
      const uint8_t* base = (full ? r.rows + size_t(g4) * 4 * kAccPlaneRows : tail) + 16 * h;
      if (h == 0) __builtin_prefetch(base + 8 * 4 * kAccPlaneRows), __builtin_prefetch(base + 8 * 4 * kAccPlaneRows + 64),
                  __builtin_prefetch(base + 8 * 4 * kAccPlaneRows + 128);
      const __m512i x = _mm512_permutex2var_epi8(_mm512_loadu_si512(base), idx, _mm512_loadu_si512(base + 64));
      const __m512i pl[4] = {_mm512_and_si512(x, m3), _mm512_and_si512(_mm512_srli_epi16(x, 2), m3),
                             _mm512_and_si512(_mm512_srli_epi16(x, 4), m3), _mm512_and_si512(_mm512_srli_epi16(x, 6), m3)};
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        int32_t wq;
        std::memcpy(&wq, w8[i] + 4 * g4, 4);
        const __m512i wv = _mm512_set1_epi32(wq);
        KVQ_UNROLL
        for (int k = 0; k < 4; ++k) a[i][k] = _mm512_dpbusd_epi32(a[i][k], pl[k], wv);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) {
      const __m512 f = _mm512_set1_ps(step[i]);
      KVQ_UNROLL
      for (int k = 0; k < 4; ++k) {  // lanes 0-7: channels 64h + 8k + j, lanes 8-15: 64h + 32 + 8k + j
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a[i][k]), f);
        float* o0 = acc + size_t(i) * r.d + 64 * h + 8 * k;
        float* o1 = o0 + 32;
        _mm256_storeu_ps(o0, _mm256_add_ps(_mm256_loadu_ps(o0), _mm512_castps512_ps256(v)));
        _mm256_storeu_ps(o1, _mm256_add_ps(_mm256_loadu_ps(o1), _mm512_extractf32x8_ps(v, 1)));
      }
    }
  }
}

void accumulate_int2_planes(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  constexpr int kMaxRows = 512;  // rows per pass (weights on the stack)
  alignas(64) float sc[kMaxRows], zr[kMaxRows];
  alignas(64) int8_t w8[kPlaneQB][kMaxRows + 16];  // zero-padded to a multiple of 16
  for (int r0 = 0; r0 < r.n_rows; r0 += kMaxRows) {
    RowsView part = r;
    part.rows = r.rows + size_t(r0) * r.row_stride;
    part.n_rows = r.n_rows - r0 < kMaxRows ? r.n_rows - r0 : kMaxRows;
    const int n = part.n_rows;
    plane_row_params(part, n, (n + 15) / 16 * 16, sc, zr);
    for (int i0 = 0; i0 < n_q; i0 += kPlaneQB) {
      const int qb = n_q - i0 < kPlaneQB ? n_q - i0 : kPlaneQB;
      float step[kPlaneQB];
      const int8_t* wp[kPlaneQB];
      for (int i = 0; i < qb; ++i) {
        const float* pi = p + size_t(i0 + i) * p_stride + r0;
        __m512 m = _mm512_setzero_ps();
        for (int t = 0; t < n; t += 16) {
          const __mmask16 k = n - t >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - t)) - 1);
          m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, pi + t), _mm512_load_ps(sc + t))));
        }
        const float mx = _mm512_reduce_max_ps(m);
        step[i] = mx > 0.f ? mx / 127.f : 1.f;
        const float inv = 1.f / step[i];
        // w8 = round(w / step) (nearest even), zero beyond n; Σ_t w8_t · zero_t: the zero term with the same
        // rounded weights the codes get.
        __m512 zs = _mm512_setzero_ps();
        for (int t = 0; t < n; t += 16) {
          const __mmask16 k = n - t >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - t)) - 1);
          const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pi + t), _mm512_load_ps(sc + t));
          const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(w, _mm512_set1_ps(inv)));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(w8[i] + t), _mm512_cvtsepi32_epi8(v));
          zs = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_load_ps(zr + t), zs);
        }
        const float zsum = _mm512_reduce_add_ps(zs);
        wp[i] = w8[i];
        float* a = acc + size_t(i0 + i) * r.d;
        const __m512 z = _mm512_set1_ps(zsum * step[i]);
        for (int c = 0; c < r.d; c += 16) _mm512_storeu_ps(a + c, _mm512_sub_ps(_mm512_loadu_ps(a + c), z));
      }
      float* ai = acc + size_t(i0) * r.d;
      switch (qb) {
        case 4: accumulate_planes_block<4>(part, wp, step, ai); break;
        case 3: accumulate_planes_block<3>(part, wp, step, ai); break;
        case 2: accumulate_planes_block<2>(part, wp, step, ai); break;
        default: accumulate_planes_block<1>(part, wp, step, ai); break;
      }
    }
  }
}

// int2 accumulate: the plane kernel for 128-value rows of one group (36-byte rows), else int16 VNNI.
void accumulate_int2(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  if (r.grouped && r.group == 128 && r.d == 128 && r.row_stride == kAccPlaneRows && r.codes_offset == 4)
    accumulate_int2_planes(r, p, p_stride, n_q, acc);
  else
    accumulate_i16<IVnni, RowFormat::kInt2>(r, p, p_stride, n_q, acc);
}

}  // namespace

RowKernels row_kernels_avx512_vnni(RowFormat format) {
  switch (format) {
    case RowFormat::kInt2: return {scores_int2, accumulate_int2};
    case RowFormat::kInt4: return {scores_i16<IVnni, RowFormat::kInt4>, accumulate_i16<IVnni, RowFormat::kInt4>};
    case RowFormat::kInt8: return {scores_i16<IVnni, RowFormat::kInt8>, accumulate_i16<IVnni, RowFormat::kInt8>};
    default: break;  // bf16, f16 and llama.cpp's blocks: the AVX-512 float kernels
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
