// The int16 row kernels of the int formats (every int row but int2 at G = d, which the plane kernels take), written
// once over an integer traits type I; included inside the anonymous namespace of simd_avx2_int.cpp and
// simd_avx512_vnni.cpp, after their target pragma and their traits. I provides:
//   Unit, unit<Fmt>(p), no_unit()  the 32 codes of one packed unit, widened to int16 (no_unit: all zero)
//   Acc, zero(), dot(a, x, q)  int32 lanes; a + Σ pairs of x · q[0 .. 32) (vpmaddwd + add, or vpdpwssd)
//   madd(a, x, w)              a + Σ pairs of int16 lanes x · w (the same instruction on two vectors)
//   bcast32(v)                 v in every int32 lane (a pair of int16 weights)
//   kPairVectors, pairs(x, y, out)  two tokens' units interleaved into kPairVectors vectors, each int32 lane one
//                              channel's (code of x, code of y)
//   add_channels(sums, f, out) out[0 .. 32) += f · the kPairVectors vectors' int32 sums, put back in channel order
//   hsum4(const Acc*)          [Σ a0, Σ a1, Σ a2, Σ a3]
//   quantize(x, n, out, sum)   x rounded to int16 with step max|x| / 32767; returns the step, sum = Σx
//   tile_weights(pt, sc, zr, w16, zdot)  w = pt · sc of one 32-token tile (pt 64-byte aligned) rounded the same way
//                              into w16; returns the step, zdot = Σ w16 · zr (the zero term with the codes' weights)
//   subtract(a, n, z)          a[0 .. n) -= z, n a multiple of 32
//   kScoresQB, kAccQB          the largest query block of each kernel (registers)
// Scale and zero are applied once per group (scores) or once per tile (accumulate), so each result is the exact float
// result of the rounded operand: relative 2^-16 of the largest element of a group or tile.

constexpr int kQ16Stride = 256;  // int16 query row stride (d <= 256)

// ---- int16 scores ----
// Scores of rows [t0, t0+nt) for QB queries (QB = 1, 2 or a multiple of 4): integer sums per group, reduced four
// queries at a time, then s = Σ_g scale_g·qstep_g·isum_g - Σ_g scale_g·zero_g·Σq_g.
template <class I, RowFormat Fmt, int QB>
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
      typename I::Acc acc[kQ4 * 4];
      KVQ_UNROLL
      for (int i = 0; i < kQ4 * 4; ++i) acc[i] = I::zero();
      for (int u = g * upg; u < (g + 1) * upg; ++u) {
        const typename I::Unit x = I::template unit<Fmt>(codes + u * kUB);
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i) acc[i] = I::dot(acc[i], x, q16 + i * kQ16Stride + u * 32);
      }
      float sc = 1.f, zr = 0.f;
      if (r.grouped) {
        const layout::GroupParams gp = row_params(row, g);
        sc = _cvtsh_ss(gp.scale), zr = _cvtsh_ss(gp.zero);
      }
      const __m128 scv = _mm_set1_ps(sc), szv = _mm_set1_ps(sc * zr);
      KVQ_UNROLL
      for (int j = 0; j < kQ4; ++j) {
        const __m128i h = I::hsum4(&acc[4 * j]);
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

template <class I, RowFormat Fmt>
void scores_i16(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  const int d = r.d, ng = d / r.group;
  alignas(64) int16_t q16[kChunkQ * kQ16Stride];
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    float qsum[kChunkQ][kMaxGroups] = {}, qstep[kChunkQ][kMaxGroups];
    for (int i = 0; i < nc; ++i)
      for (int g = 0; g < ng; ++g) {
        const float* qg = q + size_t(c0 + i) * d + g * r.group;
        qstep[i][g] = I::quantize(qg, r.group, q16 + i * kQ16Stride + g * r.group, qsum[i][g]);
      }
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for_query_blocks(nc, I::kScoresQB, [&]<int QB>(int i0) {
        scores_block_i16<I, Fmt, QB>(r, t0, nt, q16 + i0 * kQ16Stride, qstep + i0, qsum + i0,
                                     s + size_t(c0 + i0) * s_stride, s_stride);
      });
    }
  }
}

// ---- int16 accumulate ----
// acc[i, :] += wstep[i][g] · Σ_t w16[i][g][t] · code_t over rows [t0, t0 + nt). Two tokens per int32 lane: read as
// uint32, w16[i][g][2·pr .. 2·pr + 1] packs the int16 weights of tokens 2·pr (low) and 2·pr + 1 (high), multiplied
// with each channel's pair of codes.
template <class I, RowFormat Fmt, int QB>
void accumulate_block_i16(const RowsView& r, int t0, int nt, const int16_t (*w16)[kMaxGroups][kTileRows],
                          const float (*wstep)[kMaxGroups], float* acc) {
  using Acc = typename I::Acc;
  constexpr int kUB = fmt_unit_bytes<Fmt>(), kP = I::kPairVectors;
  const int d = r.d, upg = r.group / 32;
  for (int u = 0; u < d / 32; ++u) {
    const int g = u / upg;
    Acc sums[QB][kP];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < kP; ++k) sums[i][k] = I::zero();
    const uint8_t* codes = r.rows + size_t(t0) * r.row_stride + r.codes_offset + u * kUB;
    for (int pr = 0; 2 * pr < nt; ++pr) {
      prefetch_unit(r, t0 + 2 * pr + kPrefetchTiles * kTileRows, u * kUB);
      prefetch_unit(r, t0 + 2 * pr + 1 + kPrefetchTiles * kTileRows, u * kUB);
      const typename I::Unit x = I::template unit<Fmt>(codes + size_t(2 * pr) * r.row_stride);
      const typename I::Unit y =
          2 * pr + 1 < nt ? I::template unit<Fmt>(codes + size_t(2 * pr + 1) * r.row_stride) : I::no_unit();
      Acc xy[kP];
      I::pairs(x, y, xy);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        int32_t pair;
        std::memcpy(&pair, &w16[i][g][2 * pr], 4);
        const Acc wv = I::bcast32(pair);
        KVQ_UNROLL
        for (int k = 0; k < kP; ++k) sums[i][k] = I::madd(sums[i][k], xy[k], wv);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) I::add_channels(sums[i], wstep[i][g], acc + i * d + u * 32);
  }
}

// Per 32-token tile: the weights w = p · scale rounded to int16 per query and group, then accumulate_block_i16
// (acc += wstep · Σ_t w16_t · code_t); the zero term Σ_t w_t · zero_t, with the same rounded weights, is subtracted
// once per call.
template <class I, RowFormat Fmt>
void accumulate_i16(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  const int d = r.d, ng = d / r.group;
  static_assert(kTileRows == 32, "one tile = 32 weights");
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
      for (int i = 0; i < nc; ++i) {
        alignas(64) float pt[kTileRows] = {};  // the tile's weights, zero past nt
        std::memcpy(pt, p + size_t(c0 + i) * p_stride + t0, sizeof(float) * size_t(nt));
        for (int g = 0; g < ng; ++g) {
          float zdot = 0.f;
          wstep[i][g] = I::tile_weights(pt, sc[g], zr[g], w16[i][g], zdot);
          if (r.grouped) zsum[i][g] += double(zdot) * wstep[i][g];
        }
      }
      for_query_blocks(nc, I::kAccQB, [&]<int QB>(int i0) {
        accumulate_block_i16<I, Fmt, QB>(r, t0, nt, w16 + i0, wstep + i0, acc + size_t(c0 + i0) * d);
      });
    }
    if (r.grouped)  // once per call (per cache page in attention)
      for (int i = 0; i < nc; ++i)
        for (int g = 0; g < ng; ++g) {
          I::subtract(acc + size_t(c0 + i) * d + g * r.group, r.group, float(zsum[i][g]));
        }
  }
}
