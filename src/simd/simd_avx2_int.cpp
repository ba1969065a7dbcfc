// AVX2 row kernels for the int formats (int2 / int4 / int8): integer dot products, for the CPUs without AVX-512 (most
// laptops and desktops, AMD Zen 2 / 3 servers). The same arithmetic as the AVX-512 VNNI kernels
// (simd_avx512_vnni.cpp), with AVX2's two-instruction forms of its dot products:
//   - scores of int2 rows of one 128-value group (G = d = 128: the default cache): the query rounded to int8 with
//     step max|q| / 127 and multiplied with bit planes of the packed codes by vpmaddubsw (u8 code × s8 query, pairs
//     summed into int16: at most 2·3·127 per lane, so four planes add up in int16), then widened by vpmaddwd with ones;
//     the value side multiplies two tokens' codes of a channel with their int8 weights the same way;
//   - every other int row: the query (scores) and the weights w = p·scale (accumulate, per 32-token tile) rounded to
//     int16 with step max|x| / 32767, the codes widened to int16, vpmaddwd into int32 lanes.
// Scale and zero are applied once per group (scores) or once per tile (accumulate), and the zero term uses the same
// rounded q / w as the codes, so each result is the exact float result of the rounded operand: relative 2^-16 of the
// largest element of a group or tile (int16), or 1/254 of the query's largest element (the int2 plane scores, which
// the VNNI level rounds the same way; tests/test_cache_attention.cpp measures its cost on models/ref).
// Compiled for its target by the pragma below; called only when simd_level_supported(kAvx2).
#include <algorithm>
#include <cmath>
#include <cstring>


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

#include "simd/simd_kernels_impl.h"  // tile sizes and helpers (its float templates are not instantiated here)

// The 32 codes of one packed unit as int16 in value order: values 0-15 in lo, 16-31 in hi.
template <RowFormat Fmt>
inline void unit_i16(const uint8_t* p, __m256i& lo, __m256i& hi) {
  __m128i a, b;  // values 0-15, 16-31 as bytes
  if constexpr (Fmt == RowFormat::kInt2) {
    int64_t x;
    std::memcpy(&x, p, 8);
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(x), _mm256_setr_epi64x(0, 2, 4, 6)),
                                       _mm256_set1_epi8(3));  // 64-bit lane k = values 8k .. 8k+7
    a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
  } else if constexpr (Fmt == RowFormat::kInt4) {  // byte j: value j (low nibble), j + 16 (high)
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0f);
    a = _mm_and_si128(x, m), b = _mm_and_si128(_mm_srli_epi16(x, 4), m);
  } else {
    a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  }
  lo = _mm256_cvtepu8_epi16(a), hi = _mm256_cvtepu8_epi16(b);
}

inline float hmax_abs(__m256 m) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }

// 8 floats rounded to nearest even and saturated to int16, in order.
inline __m128i to_i16(__m256 v) {
  const __m256i i = _mm256_cvtps_epi32(v);
  return _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
}

// Quantize one group of n (a multiple of 8) floats to int16 with step max|x| / 32767 (step 1 for an all-zero group);
// sum gets Σx. Once per query and group per call (per cache page in attention).
inline float quantize_group_i16(const float* x, int n, int16_t* out, float& sum) {
  __m256 m = _mm256_setzero_ps(), s = _mm256_setzero_ps();
  for (int k = 0; k < n; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    m = _mm256_max_ps(m, abs_ps(v));
    s = _mm256_add_ps(s, v);
  }
  const float mx = hmax_abs(m);
  sum = hsum_ps(s);
  const float step = mx > 0.f ? mx / 32767.f : 1.f;
  const __m256 inv = _mm256_set1_ps(1.f / step);
  for (int k = 0; k < n; k += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), to_i16(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv)));
  return step;
}

// Per 128-bit lane, the partial sums of 4 int32 vectors: lane h of the result = [Σa, Σb, Σc, Σd] over lane h.
inline __m256i hsum4_lanes(const __m256i* v) {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

// Horizontal sums of 4 int32 vectors: [Σa, Σb, Σc, Σd].
inline __m128i hsum4_epi32(const __m256i* v) {
  const __m256i t = hsum4_lanes(v);
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

// ---- int16 kernels (every int row but int2 at G = d): simd_int16_impl.h over these traits ----
struct IAvx2 {
  struct Unit {
    __m256i lo, hi;  // values 0-15, 16-31
  };
  using Acc = __m256i;
  static constexpr int kScoresQB = 4, kAccQB = 2;  // 16 ymm registers
  template <RowFormat Fmt>
  static Unit unit(const uint8_t* p) {
    Unit u;
    unit_i16<Fmt>(p, u.lo, u.hi);
    return u;
  }
  static Acc zero() { return _mm256_setzero_si256(); }
  static Unit no_unit() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static Acc dot(Acc acc, const Unit& x, const int16_t* q) {
    const __m256i a = _mm256_madd_epi16(x.lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    const __m256i b = _mm256_madd_epi16(x.hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
    return _mm256_add_epi32(acc, _mm256_add_epi32(a, b));
  }
  static Acc madd(Acc acc, Acc x, Acc w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w)); }
  static Acc bcast32(int32_t v) { return _mm256_set1_epi32(v); }
  // unpacklo / unpackhi of two tokens' halves, per 128-bit lane (lane 0 channels 0-7, lane 1 channels 8-15):
  // out[0] = channels {0-3 | 8-11}, out[1] = {4-7 | 12-15}, out[2], out[3] the same for channels 16-31.
  static constexpr int kPairVectors = 4;
  static void pairs(const Unit& x, const Unit& y, Acc* out) {
    out[0] = _mm256_unpacklo_epi16(x.lo, y.lo), out[1] = _mm256_unpackhi_epi16(x.lo, y.lo);
    out[2] = _mm256_unpacklo_epi16(x.hi, y.hi), out[3] = _mm256_unpackhi_epi16(x.hi, y.hi);
  }
  static void add_channels(const Acc* sums, float f, float* out) {
    const __m256 fv = _mm256_set1_ps(f);
    KVQ_UNROLL
    for (int h = 0; h < 2; ++h) {  // channels 16h + 0-7: lanes 0 of the pair (sums[2h], sums[2h+1]); 8-15: lanes 1
      const __m256i c0 = _mm256_permute2x128_si256(sums[2 * h], sums[2 * h + 1], 0x20);
      const __m256i c1 = _mm256_permute2x128_si256(sums[2 * h], sums[2 * h + 1], 0x31);
      float* o = out + 16 * h;
      _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), fv, _mm256_loadu_ps(o)));
      _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), fv, _mm256_loadu_ps(o + 8)));
    }
  }
  static __m128i hsum4(const Acc* v) { return hsum4_epi32(v); }
  static float quantize(const float* x, int n, int16_t* out, float& sum) { return quantize_group_i16(x, n, out, sum); }
  static void subtract(float* a, int n, float z) {
    const __m256 zv = _mm256_set1_ps(z);
    for (int c = 0; c < n; c += 8) _mm256_storeu_ps(a + c, _mm256_sub_ps(_mm256_loadu_ps(a + c), zv));
  }
  // w = pt · sc for one tile, rounded to int16 with step max|w| / 32767.
  static float tile_weights(const float* pt, const float* sc, const float* zr, int16_t* w16, float& zdot) {
    __m256 w[4], m = _mm256_setzero_ps();
    KVQ_UNROLL
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm256_mul_ps(_mm256_load_ps(pt + 8 * k), _mm256_load_ps(sc + 8 * k));
      m = _mm256_max_ps(m, abs_ps(w[k]));
    }
    const float mx = hmax_abs(m);
    const float step = mx > 0.f ? mx / 32767.f : 1.f;
    const __m256 inv = _mm256_set1_ps(1.f / step);
    __m256 z = _mm256_setzero_ps();
    KVQ_UNROLL
    for (int k = 0; k < 4; ++k) {
      const __m256i iw = _mm256_cvtps_epi32(_mm256_mul_ps(w[k], inv));  // |w / step| <= 32767
      _mm_store_si128(reinterpret_cast<__m128i*>(w16 + 8 * k),
                      _mm_packs_epi32(_mm256_castsi256_si128(iw), _mm256_extracti128_si256(iw, 1)));
      z = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iw), _mm256_load_ps(zr + 8 * k), z);
    }
    zdot = hsum_ps(z);
    return step;
  }
};

#include "simd/simd_int16_impl.h"

// ---- int2 scores with one group of 128 per row (the default): int8 queries, vpmaddubsw on bit planes ----
// A row's packed codes are 32 bytes; byte 8u + j holds values 32u + j + 8k in bits 2k (layout.h). Plane k of them,
// (x >> 2k) & 3, is 32 unsigned codes; the matching query bytes are q8 at those positions. vpmaddubsw(plane_k, q8_k)
// holds pairs' sums in int16 (|lane| <= 2·3·127), the four planes add up in int16 (<= 3048), and one vpmaddwd with
// ones widens them to 8 int32 lanes. q is rounded with step max|q| / 127 and the zero term uses the same rounded q:
//   s = scale · step · (Σ q8·code − zero · Σ q8).
struct PlaneQuery {
  alignas(32) int8_t planes[4][32];  // [plane k][byte b] = q8 at value 32u + j + 8k (b = 8u + j)
  float step;                        // q ≈ step · q8
  int32_t sum;                       // Σ q8
};

inline void make_plane_query(const float* q, PlaneQuery& out) {
  constexpr int d = 128;
  __m256 m = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(q + c)));
  const float mx = hmax_abs(m);
  out.step = mx > 0.f ? mx / 127.f : 1.f;
  const __m256 inv = _mm256_set1_ps(1.f / out.step);
  alignas(32) int8_t q8[d];
  __m256i sum = _mm256_setzero_si256();
  for (int c = 0; c < d; c += 16) {  // round to nearest even; |q / step| <= 127 by construction
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(q + c), inv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(q + c + 8), inv));
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, b));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i x = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    _mm_store_si128(reinterpret_cast<__m128i*>(q8 + c), _mm_packs_epi16(w, x));
  }
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  out.sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
  // plane k = the 8-value runs starting at 32u + 8k, u = 0..3
  for (int k = 0; k < 4; ++k)
    for (int u = 0; u < 4; ++u) std::memcpy(&out.planes[k][8 * u], q8 + 32 * u + 8 * k, 8);
}

#include "simd/simd_int2_planes_impl.h"

// Rows t0 .. t0 + nt of QB <= 4 queries, two rows a step: each plane of the two rows meets every query's plane
// bytes once (one load for both rows), and the step's 8 (row, query) integer sums come out of one reduction as one
// vector [row a: q0 .. q3 | row b: q0 .. q3] (queries past QB have zero sums). An odd last row is paired with itself.
// The tile's sums are then scaled 8 rows at a time (simd_int2_planes_impl.h).
template <int QB>
void scores_planes_block(const RowsView& r, int t0, int nt, const PlaneQuery* pq, float* s, size_t s_stride) {
  const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  alignas(32) int32_t sums[kTileRows + 1][4];  // [row][query], one store per pair
  for (int t = 0; t < nt; t += 2) {
    const uint8_t* ra = r.rows + size_t(t0 + t) * r.row_stride;
    const uint8_t* rb = t + 1 < nt ? ra + r.row_stride : ra;
    prefetch_row(r, t0 + t + 2 * kPrefetchRows);  // this kernel outruns the float ones: look further ahead
    prefetch_row(r, t0 + t + 2 * kPrefetchRows + 1);
    __m256i acc[8];  // int16 sums: [0, 4) row a's queries, [4, 8) row b's
    const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + r.codes_offset));
    const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + r.codes_offset));
    KVQ_UNROLL
    for (int k = 0; k < 4; ++k) {
      const __m256i pa = _mm256_and_si256(_mm256_srli_epi16(xa, 2 * k), m3);
      const __m256i pb = _mm256_and_si256(_mm256_srli_epi16(xb, 2 * k), m3);
      KVQ_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (i >= QB) {
          if (k == 0) acc[i] = acc[4 + i] = _mm256_setzero_si256();
          continue;
        }
        const __m256i qk = _mm256_load_si256(reinterpret_cast<const __m256i*>(pq[i].planes[k]));
        const __m256i ma = _mm256_maddubs_epi16(pa, qk), mb = _mm256_maddubs_epi16(pb, qk);
        acc[i] = k == 0 ? ma : _mm256_add_epi16(acc[i], ma);
        acc[4 + i] = k == 0 ? mb : _mm256_add_epi16(acc[4 + i], mb);
      }
    }
    KVQ_UNROLL
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_madd_epi16(acc[j], ones);
    const __m256i la = hsum4_lanes(acc), lb = hsum4_lanes(acc + 4);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums[t]), _mm256_add_epi32(_mm256_permute2x128_si256(la, lb, 0x20),
                                                                             _mm256_permute2x128_si256(la, lb, 0x31)));
  }
  scale_plane_sums<QB>(r, t0, nt, sums, pq, s, s_stride);
}

void scores_int2_planes(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  PlaneQuery pq[kChunkQ];
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    for (int i = 0; i < nc; ++i) make_plane_query(q + size_t(c0 + i) * r.d, pq[i]);
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int i0 = 0; i0 < nc;) {
        const int qb = nc - i0 >= 4 ? 4 : nc - i0;
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

// int2 scores: the plane kernel when the row is one group of 128 (G = d = 128), else int16.
void scores_int2(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  if (r.grouped && r.group == 128 && r.d == 128)
    scores_int2_planes(r, q, n_q, s, s_stride);
  else
    scores_i16<IAvx2, RowFormat::kInt2>(r, q, n_q, s, s_stride);
}

// ---- int2 accumulate with one group of 128 per row: int8 weights, vpmaddubsw on bit planes of 2 tokens ----
// w = p · scale per token is rounded to int8 with one step per query and call (max|w| / 127); the zero term
// Σ_t w8_t · zero_t is subtracted once per call. Rows are 36 bytes (GroupParams + 32 code bytes); byte m of a row
// holds the codes of channels 32(m / 8) + m % 8 + 8k in bits 2k. For plane k of two rows t, t+1, unpacklo / unpackhi
// of their planes' bytes pair the two tokens' codes of one channel in each int16 lane, and vpmaddubsw with the
// tokens' int8 weights [w_t, w_t+1] in every lane leaves c_t·w_t + c_t+1·w_t+1 (<= 2·3·127) per channel:
//   lo, 128-bit lane 0: channels 8k + 0..7, lane 1: 64 + 8k + 0..7; hi: 32 + 8k + 0..7 and 96 + 8k + 0..7.
// Each plane's sums stay in int16 for kFlushPairs pairs of rows, then widen into int32 channel sums. The pairs' weights
// are laid out as whole vectors beforehand, so the multiply reads them as its memory operand.
constexpr int kAccPlaneRows = 4 + 32;  // bytes of one row this kernel reads (G = d = 128)
constexpr int kFlushPairs = 32;        // pairs of rows summed in int16 between widenings: 32 · 762 < 32767
constexpr int kMaxPlaneRows = 512;     // rows per pass (weights on the stack)

// dst[0 .. 8) += the 8 int16 sums of v, widened.
inline void widen_into(int32_t* dst, __m128i v) {
  __m256i* d = reinterpret_cast<__m256i*>(dst);
  _mm256_storeu_si256(d, _mm256_add_epi32(_mm256_loadu_si256(d), _mm256_cvtepi16_epi32(v)));
}

// acc32[i][c] (int32, channel order) += Σ_t w8_t · code_t,c over plane K of the pass's rows, for QB <= 4 queries.
// wpair[i][pr]: the int16 lane (w8 of row 2pr, w8 of row 2pr + 1) repeated over a vector. An odd last row is paired
// with zero codes (its partner's weight is 0 too).
template <int QB, int K>
void accumulate_plane(const RowsView& r, const __m256i (*wpair)[kMaxPlaneRows / 2], int32_t (*acc32)[128]) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const int n_pairs = (r.n_rows + 1) / 2;
  const uint8_t* codes = r.rows + 4;
  for (int p0 = 0; p0 < n_pairs; p0 += kFlushPairs) {
    const int p1 = std::min(n_pairs, p0 + kFlushPairs);
    __m256i lo[QB], hi[QB];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) lo[i] = _mm256_setzero_si256(), hi[i] = _mm256_setzero_si256();
    for (int pr = p0; pr < p1; ++pr) {
      const uint8_t* a = codes + size_t(2 * pr) * kAccPlaneRows;
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
      const __m256i xb = 2 * pr + 1 < r.n_rows
                             ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + kAccPlaneRows))
                             : _mm256_setzero_si256();
      const __m256i pa = _mm256_and_si256(_mm256_srli_epi16(xa, 2 * K), m3);
      const __m256i pb = _mm256_and_si256(_mm256_srli_epi16(xb, 2 * K), m3);
      const __m256i ul = _mm256_unpacklo_epi8(pa, pb), uh = _mm256_unpackhi_epi8(pa, pb);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        lo[i] = _mm256_add_epi16(lo[i], _mm256_maddubs_epi16(ul, wpair[i][pr]));
        hi[i] = _mm256_add_epi16(hi[i], _mm256_maddubs_epi16(uh, wpair[i][pr]));
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) {  // lo: channels 8K | 64 + 8K, hi: 32 + 8K | 96 + 8K (8 each)
      widen_into(acc32[i] + 8 * K, _mm256_castsi256_si128(lo[i]));
      widen_into(acc32[i] + 64 + 8 * K, _mm256_extracti128_si256(lo[i], 1));
      widen_into(acc32[i] + 32 + 8 * K, _mm256_castsi256_si128(hi[i]));
      widen_into(acc32[i] + 96 + 8 * K, _mm256_extracti128_si256(hi[i], 1));
    }
  }
}

template <int QB>
void accumulate_planes_block(const RowsView& r, const __m256i (*wpair)[kMaxPlaneRows / 2], int32_t (*acc32)[128]) {
  accumulate_plane<QB, 0>(r, wpair, acc32);
  accumulate_plane<QB, 1>(r, wpair, acc32);
  accumulate_plane<QB, 2>(r, wpair, acc32);
  accumulate_plane<QB, 3>(r, wpair, acc32);
}

void accumulate_int2_planes(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  alignas(32) float sc[kMaxPlaneRows + 8], zr[kMaxPlaneRows + 8], w[kMaxPlaneRows + 8];
  alignas(32) __m256i wpair[4][kMaxPlaneRows / 2];
  // shuffle controls: pair j of 8 rows' int8 weights (bytes 2j, 2j + 1) repeated over every int16 lane
  const __m256i pair_bytes[4] = {_mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0302), _mm256_set1_epi16(0x0504),
                                 _mm256_set1_epi16(0x0706)};
  alignas(32) int32_t acc32[4][128];
  for (int r0 = 0; r0 < r.n_rows; r0 += kMaxPlaneRows) {
    RowsView part = r;
    part.rows = r.rows + size_t(r0) * r.row_stride;
    part.n_rows = r.n_rows - r0 < kMaxPlaneRows ? r.n_rows - r0 : kMaxPlaneRows;
    const int n = part.n_rows, n8 = (n + 7) / 8 * 8;
    plane_row_params(part, n, n8, sc, zr);
    for (int c0 = 0; c0 < n_q; c0 += 4) {
      const int nc = n_q - c0 < 4 ? n_q - c0 : 4;
      float step[4];
      for (int i = 0; i < nc; ++i) {
        // w = p · scale (0 past n), and its largest magnitude
        const float* pt = p + size_t(c0 + i) * p_stride + r0;
        __m256 m = _mm256_setzero_ps();
        for (int t = 0; t < n8; t += 8) {
          __m256 pv;
          if (t + 8 <= n) {
            pv = _mm256_loadu_ps(pt + t);
          } else {
            alignas(32) float tail[8] = {};
            std::memcpy(tail, pt + t, sizeof(float) * size_t(n - t));
            pv = _mm256_load_ps(tail);
          }
          const __m256 wv = _mm256_mul_ps(pv, _mm256_load_ps(sc + t));
          _mm256_store_ps(w + t, wv);
          m = _mm256_max_ps(m, abs_ps(wv));
        }
        const float mx = hmax_abs(m);
        step[i] = mx > 0.f ? mx / 127.f : 1.f;
        const __m256 inv = _mm256_set1_ps(1.f / step[i]);
        // w8 = round(w / step) (nearest even), zero past n; the zero term with the same rounded weights; the pairs'
        // vectors, w8 of rows 2pr (low byte) and 2pr + 1 (high) over a vector: 8 rows' w8 in every 64-bit lane, then a
        // byte shuffle per pair
        __m256 zs = _mm256_setzero_ps();
        for (int t = 0; t < n8; t += 8) {
          const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(w + t), inv));
          const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
          const __m256i w8 = _mm256_broadcastq_epi64(_mm_packs_epi16(h, h));
          KVQ_UNROLL
          for (int j = 0; j < 4; ++j) wpair[i][t / 2 + j] = _mm256_shuffle_epi8(w8, pair_bytes[j]);
          zs = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_load_ps(zr + t), zs);
        }
        const __m256 z = _mm256_set1_ps(hsum_ps(zs) * step[i]);
        float* a = acc + size_t(c0 + i) * r.d;
        for (int c = 0; c < r.d; c += 8) _mm256_storeu_ps(a + c, _mm256_sub_ps(_mm256_loadu_ps(a + c), z));
      }
      std::memset(acc32, 0, sizeof(acc32[0]) * size_t(nc));
      switch (nc) {
        case 4: accumulate_planes_block<4>(part, wpair, acc32); break;
        case 3: accumulate_planes_block<3>(part, wpair, acc32); break;
        case 2: accumulate_planes_block<2>(part, wpair, acc32); break;
        default: accumulate_planes_block<1>(part, wpair, acc32); break;
      }
      for (int i = 0; i < nc; ++i) {  // this pass's integer sums, at its step, into each channel
        const __m256 f = _mm256_set1_ps(step[i]);
        float* a = acc + size_t(c0 + i) * r.d;
        for (int c = 0; c < 128; c += 8)
          _mm256_storeu_ps(a + c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256(
                                                      reinterpret_cast<const __m256i*>(acc32[i] + c))),
                                                  f, _mm256_loadu_ps(a + c)));
      }
    }
  }
}

// int2 accumulate: the plane kernel for 128-value rows of one group (36-byte rows), else int16.
void accumulate_int2(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  if (r.grouped && r.group == 128 && r.d == 128 && r.row_stride == kAccPlaneRows && r.codes_offset == 4)
    accumulate_int2_planes(r, p, p_stride, n_q, acc);
  else
    accumulate_i16<IAvx2, RowFormat::kInt2>(r, p, p_stride, n_q, acc);
}

}  // namespace

RowKernels row_kernels_avx2_int(RowFormat format) {
  switch (format) {
    case RowFormat::kInt2: return {scores_int2, accumulate_int2};
    case RowFormat::kInt4: return {scores_i16<IAvx2, RowFormat::kInt4>, accumulate_i16<IAvx2, RowFormat::kInt4>};
    case RowFormat::kInt8: return {scores_i16<IAvx2, RowFormat::kInt8>, accumulate_i16<IAvx2, RowFormat::kInt8>};
    default: break;
  }
  return {nullptr, nullptr};
}

}  // namespace kvq

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
