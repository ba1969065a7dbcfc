// The row kernels written once over a vector-traits type V; included by simd_scalar.cpp, simd_avx2.cpp
// and simd_avx512.cpp INSIDE `namespace kvq { namespace {` after each file defines its V (and, for the
// SIMD files, after `#pragma GCC target`), so every level gets its own internal-linkage instantiations.
// No #includes here but its sibling fragment simd_blocks_impl.h: everything they need (simd.h, layout.h,
// llamacpp_blocks.h, <cstring>) is included by the file before.
//
// V provides: F (vector of kW floats), kW, kMaxQBScores, kMaxQBAcc (query-block sizes that fit the
// registers), kScoreChains (independent sums per query in the row scores, a divisor of 32 / kW) and kMaxQBRowScores
// (the row scores' query block: QB · kScoreChains sums in registers), zero(), loadu(const float*), storeu(float*, F),
// bcast(float), fma(a, b, c) = a·b + c,
// add(a, b), sub(a, b), mul(a, b), transpose(src, src_stride, dst, dst_stride) of a kW × kW block, hsum(F), hsum4(const F v[4], float out[4]), half(uint16_t fp16 bits) -> float, unit<Fmt>(const uint8_t* unit, F out[32 / kW])
// that turns one packed unit of 32 values (layout.h) into floats in value order, and block<Fmt>(const uint8_t* block,
// F out[32 / kW]) that turns one llama.cpp block's codes into their levels (simd_blocks_impl.h).

constexpr int kTileRows = 32;   // rows per tile: a tile's rows stay in L1 while every query block reads them
constexpr int kChunkQ = 16;     // queries per chunk (fixed-size stack buffers); n_q > 16 re-reads rows
constexpr int kMaxGroups = 8;   // d <= 256, group >= 32

template <RowFormat Fmt>
constexpr int fmt_unit_bytes() {
  return Fmt == RowFormat::kBf16 || Fmt == RowFormat::kF16 ? 64
         : Fmt == RowFormat::kInt2                        ? 8
         : Fmt == RowFormat::kInt4                        ? 16
                                                          : 32;
}

inline layout::GroupParams row_params(const uint8_t* row, int g) {
  layout::GroupParams gp;
  std::memcpy(&gp, row + 4 * g, 4);
  return gp;
}

// Software prefetch of row t (if it exists) kPrefetchRows ahead: the rows stream from DRAM and the
// hardware prefetcher alone leaves the bf16 kernels waiting on memory.
constexpr int kPrefetchRows = 16;
inline void prefetch_row(const RowsView& r, int t) {
  if (t >= r.n_rows) return;
  const uint8_t* row = r.rows + size_t(t) * r.row_stride;
  for (size_t b = 0; b < r.row_stride; b += 64) __builtin_prefetch(row + b);
}

// The same for one unit of row t, kPrefetchTiles tiles ahead (accumulate walks a tile unit by unit:
// spreading the prefetches over those passes keeps few of them in flight at once).
constexpr int kPrefetchTiles = 2;
inline void prefetch_unit(const RowsView& r, int t, int unit_offset) {
  if (t >= r.n_rows) return;
  const uint8_t* row = r.rows + size_t(t) * r.row_stride;
  if (unit_offset == 0) __builtin_prefetch(row);
  __builtin_prefetch(row + r.codes_offset + unit_offset);
}

inline int pick_block(int remaining, int max_qb) {
  const int m = remaining < max_qb ? remaining : max_qb;
  return m >= 8 ? 8 : m >= 4 ? 4 : m >= 2 ? 2 : 1;
}

// THE query-block loop of every row kernel: queries [0, nc) in blocks of 8, 4, 2 and 1 (at most max_qb, the block
// whose accumulators fit the registers), calling block.template operator()<QB>(i0) for the block starting at i0 —
// QB a compile-time constant, so each block size gets its own unrolled instantiation.
template <class Block>
inline void for_query_blocks(int nc, int max_qb, const Block& block) {
  for (int i0 = 0; i0 < nc;) {
    const int qb = pick_block(nc - i0, max_qb);
    switch (qb) {
      case 8: block.template operator()<8>(i0); break;
      case 4: block.template operator()<4>(i0); break;
      case 2: block.template operator()<2>(i0); break;
      default: block.template operator()<1>(i0); break;
    }
    i0 += qb;
  }
}

// buf[i][col] = hsum(tot[i]) - zterm[i] for QB queries: horizontal sums four at once (a transposed reduction), and the
// same reduction for blocks of fewer queries (zero vectors beside them), so a query's score is the same bits in a
// block of any size and a row of a batched step (model/linear.h: apply_rows) equals the row alone.
template <class V, int QB>
inline void store_scores(const typename V::F* tot, const float* zterm, float (*buf)[kTileRows], int col) {
  if constexpr (QB >= 4) {
    KVQ_UNROLL
    for (int i = 0; i < QB; i += 4) {
      float sum4[4];
      V::hsum4(tot + i, sum4);
      for (int j = 0; j < 4; ++j) buf[i + j][col] = sum4[j] - zterm[i + j];
    }
  } else {
    typename V::F four[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) four[i] = tot[i];
    float sum4[4];
    V::hsum4(four, sum4);
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) buf[i][col] = sum4[i] - zterm[i];
  }
}

// Scores of rows [t, t+R) for QB queries into buf[i][b + j]. qsum[i][g] = Σ of query i over group g (grouped rows
// only). Each query sums into kC = V::kScoreChains independent vectors (vector k of a unit into sum k mod kC): one
// chain of FMAs per query would wait on the FMA latency at every step (decode: one or two queries per row, the f16
// weights' GEMV: one).
// R rows at a time share each query vector loaded (at a batched decode step's 16 rows the query rows no longer fit L1,
// and those loads bound the kernel). The order of a (row, query)'s sums depends on neither R, QB nor the other rows and
// queries, so its score is the same bits in any block.
template <class V, RowFormat Fmt, int QB, int R>
void scores_rows_of(const RowsView& r, int t, const float* q, const float (*qsum)[kMaxGroups], float (*buf)[kTileRows],
                    int b) {
  using F = typename V::F;
  constexpr int kU = 32 / V::kW, kUB = fmt_unit_bytes<Fmt>(), kC = V::kScoreChains;
  static_assert(kU % kC == 0 && (kC & (kC - 1)) == 0, "kScoreChains: a power of two dividing the vectors per unit");
  const int d = r.d, upg = r.group / 32, ng = d / r.group;
  const uint8_t* row[R];
  F tot[R][QB];
  float zterm[R][QB];
  KVQ_UNROLL
  for (int j = 0; j < R; ++j) {
    row[j] = r.rows + size_t(t + j) * r.row_stride;
    prefetch_row(r, t + j + kPrefetchRows);
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) tot[j][i] = V::zero(), zterm[j][i] = 0.f;
  }
  for (int g = 0; g < ng; ++g) {
    F part[R][QB][kC];
    KVQ_UNROLL
    for (int j = 0; j < R; ++j)
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i)
        KVQ_UNROLL
        for (int c = 0; c < kC; ++c) part[j][i][c] = V::zero();
    for (int u = g * upg; u < (g + 1) * upg; ++u) {
      F x[R][kU];
      KVQ_UNROLL
      for (int j = 0; j < R; ++j) V::template unit<Fmt>(row[j] + r.codes_offset + u * kUB, x[j]);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i)
        KVQ_UNROLL
        for (int k = 0; k < kU; ++k) {
          const F qv = V::loadu(q + i * d + u * 32 + k * V::kW);
          KVQ_UNROLL
          for (int j = 0; j < R; ++j) part[j][i][k % kC] = V::fma(x[j][k], qv, part[j][i][k % kC]);
        }
    }
    KVQ_UNROLL
    for (int j = 0; j < R; ++j) {
      // the kC sums of each query folded in halves (c += c + w), a tree of fixed shape; part stays in registers
      KVQ_UNROLL
      for (int w = kC / 2; w >= 1; w /= 2)
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i)
          KVQ_UNROLL
          for (int c = 0; c < w; ++c) part[j][i][c] = V::add(part[j][i][c], part[j][i][c + w]);
      if (r.grouped) {
        const layout::GroupParams gp = row_params(row[j], g);
        const float sc = V::half(gp.scale), zr = V::half(gp.zero);
        const F scv = V::bcast(sc);
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i) {
          tot[j][i] = V::fma(part[j][i][0], scv, tot[j][i]);
          zterm[j][i] += sc * zr * qsum[i][g];
        }
      } else {
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i) tot[j][i] = V::add(tot[j][i], part[j][i][0]);
      }
    }
  }
  KVQ_UNROLL
  for (int j = 0; j < R; ++j) store_scores<V, QB>(tot[j], zterm[j], buf, b + j);
}

// Scores of rows [t0, t0+nt) for QB queries, R rows at a time (the last nt mod R one at a time).
template <class V, RowFormat Fmt, int QB, int R>
void scores_block(const RowsView& r, int t0, int nt, const float* q, const float (*qsum)[kMaxGroups], float* s,
                  size_t s_stride) {
  float buf[QB][kTileRows];  // the tile's scores, written out row by row at the end (stores to QB rows
                             // n_tokens·4 bytes apart would alias in the 4K store-forwarding check)
  int b = 0;
  for (; b + R <= nt; b += R) scores_rows_of<V, Fmt, QB, R>(r, t0 + b, q, qsum, buf, b);
  for (; b < nt; ++b) scores_rows_of<V, Fmt, QB, 1>(r, t0 + b, q, qsum, buf, b);
  for (int i = 0; i < QB; ++i) std::memcpy(s + i * s_stride + t0, buf[i], sizeof(float) * size_t(nt));
}

// Rows a pass of the ungrouped rows' scores (the bf16 windows; the GEMV of model/linear.cpp for f16 weights, and for
// bf16 ones at the scalar level: above it bf16 weights take simd_gemv_impl.h) for
// kRowBlockMinQ or more queries: 4 where 4 rows of a 2-query block's kScoreChains sums fit the registers with the rows'
// vectors (AVX-512: 16 sums and 8 row vectors of 32 zmm; the scalar kernels), else 1. The bf16 GEMV of 16 rows at
// Qwen3-8B's shapes, when it ran here (bench/bench_linear.cpp batch16/, 2 threads): AVX-512 70 -> 145 GFLOP/s with 4
// rows (97 with 2).
// AVX2 keeps one row: its 4 chains a query leave no room (2 rows spill: 70 -> 57 GFLOP/s). Grouped rows (the int
// rows' float path) and fewer queries (a decode step's one row: the same bandwidth-bound speed either way) keep one.
template <class V>
constexpr int kUngroupedRows = V::kMaxQBRowScores >= 8 ? 4 : 1;
constexpr int kRowBlockMinQ = 4;

template <class V, RowFormat Fmt>
void scores_rows(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  const int d = r.d, ng = d / r.group;
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    float qsum[kChunkQ][kMaxGroups] = {};
    if (r.grouped)
      for (int i = 0; i < nc; ++i)
        for (int g = 0; g < ng; ++g)
          for (int c = g * r.group; c < (g + 1) * r.group; ++c) qsum[i][g] += q[size_t(c0 + i) * d + c];
    const bool row_blocks = !r.grouped && kUngroupedRows<V> > 1 && nc >= kRowBlockMinQ;
    const float* qc = q + size_t(c0) * d;
    float* sc = s + size_t(c0) * s_stride;
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      if (row_blocks) {
        constexpr int R = kUngroupedRows<V>;
        for_query_blocks(nc, V::kMaxQBRowScores / R, [&]<int QB>(int i0) {
          scores_block<V, Fmt, QB, R>(r, t0, nt, qc + size_t(i0) * d, qsum + i0, sc + size_t(i0) * s_stride, s_stride);
        });
      } else {
        for_query_blocks(nc, V::kMaxQBRowScores, [&]<int QB>(int i0) {
          scores_block<V, Fmt, QB, 1>(r, t0, nt, qc + size_t(i0) * d, qsum + i0, sc + size_t(i0) * s_stride, s_stride);
        });
      }
    }
  }
}

// acc[i, :] += Σ_t w[t][g][i] · code_t for rows [t0, t0+nt); w = p·scale per row, group and query.
template <class V, RowFormat Fmt, int QB>
void accumulate_block(const RowsView& r, int t0, int nt, const float (*w)[kMaxGroups][kChunkQ], float* acc) {
  using F = typename V::F;
  constexpr int kU = 32 / V::kW, kUB = fmt_unit_bytes<Fmt>();
  const int d = r.d, upg = r.group / 32;
  for (int u = 0; u < d / 32; ++u) {
    const int g = u / upg;
    F a[QB][kU];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < kU; ++k) a[i][k] = V::loadu(acc + i * d + u * 32 + k * V::kW);
    const uint8_t* codes = r.rows + size_t(t0) * r.row_stride + r.codes_offset + u * kUB;
    for (int t = 0; t < nt; ++t, codes += r.row_stride) {
      prefetch_unit(r, t0 + t + kPrefetchTiles * kTileRows, u * kUB);
      F x[kU];
      V::template unit<Fmt>(codes, x);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        const F wv = V::bcast(w[t][g][i]);
        KVQ_UNROLL
        for (int k = 0; k < kU; ++k) a[i][k] = V::fma(x[k], wv, a[i][k]);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < kU; ++k) V::storeu(acc + i * d + u * 32 + k * V::kW, a[i][k]);
  }
}

template <class V, RowFormat Fmt>
void accumulate_rows(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  const int d = r.d, ng = d / r.group;
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    double zsum[kChunkQ][kMaxGroups] = {};
    float w[kTileRows][kMaxGroups][kChunkQ];
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = r.rows + size_t(t0 + t) * r.row_stride;
        for (int g = 0; g < ng; ++g) {
          float sc = 1.f, zr = 0.f;
          if (r.grouped) {
            const layout::GroupParams gp = row_params(row, g);
            sc = V::half(gp.scale), zr = V::half(gp.zero);
          }
          for (int i = 0; i < nc; ++i) {
            const float ww = p[size_t(c0 + i) * p_stride + t0 + t] * sc;
            w[t][g][i] = ww;
            zsum[i][g] += double(ww) * zr;
          }
        }
      }
      for_query_blocks(nc, V::kMaxQBAcc, [&]<int QB>(int i0) {
        // w[t][g] + i0: the block reads its queries' weights at [t][g][0..QB)
        const auto* wi = reinterpret_cast<const float(*)[kMaxGroups][kChunkQ]>(&w[0][0][i0]);
        accumulate_block<V, Fmt, QB>(r, t0, nt, wi, acc + size_t(c0 + i0) * d);
      });
    }
    if (r.grouped)
      for (int i = 0; i < nc; ++i)
        for (int c = 0; c < d; ++c) acc[size_t(c0 + i) * d + c] -= float(zsum[i][c / r.group]);
  }
}

// ---- Many queries over the same rows (a prefill tile): each tile of rows decoded once ----
//
// The kernels above re-decode every row for each block of at most 8 queries and end each dot product with a
// horizontal sum. With a prefill tile's 64 query rows (queries × GQA group) that costs more than the products
// themselves. Here each tile of kTileRows rows is decoded once into floats x̂ = (code − z)·s, then multiplied by
// register-blocked kernels that keep QB queries × 2 vectors of sums in registers and need no horizontal sum:
// - scores read the tile transposed (kt[c][t]): a query's scores over 2 vectors of rows are its value at channel c
//   broadcast, times the tile's channel-c vectors, summed over c;
// - accumulate reads it in row order (xr[t][c]): a query's 2 vectors of output channels gain its weight for row t
//   broadcast, times row t's vectors, summed over t.
// The products sum in another order than the row path, so the two agree to float rounding (tests/test_codecs.cpp).
// Up to one chunk of queries the row path reads each row once (decode steps, the f16 GEMV of model/linear.cpp);
// past it, it re-reads every row per chunk and the decode-once tiles win (bench/bench_codecs.cpp incache/).
constexpr int kTileMinQ = kChunkQ + 1;
constexpr int kTileMaxD = 256;

// x̂ of rows [t0, t0 + nt) into xr[t·d + c]; rows nt .. kTileRows - 1 are zero.
template <class V, RowFormat Fmt>
void decode_tile(const RowsView& r, int t0, int nt, float* xr) {
  using F = typename V::F;
  constexpr int kU = 32 / V::kW, kUB = fmt_unit_bytes<Fmt>();
  const int d = r.d, upg = r.group / 32;
  for (int t = 0; t < nt; ++t) {
    const uint8_t* row = r.rows + size_t(t0 + t) * r.row_stride;
    prefetch_row(r, t0 + t + kPrefetchRows);
    for (int u = 0; u < d / 32; ++u) {
      F x[kU];
      V::template unit<Fmt>(row + r.codes_offset + u * kUB, x);
      if (r.grouped) {
        const layout::GroupParams gp = row_params(row, u / upg);
        const F sc = V::bcast(V::half(gp.scale)), zr = V::bcast(V::half(gp.zero));
        KVQ_UNROLL
        for (int k = 0; k < kU; ++k) x[k] = V::mul(V::sub(x[k], zr), sc);
      }
      KVQ_UNROLL
      for (int k = 0; k < kU; ++k) V::storeu(xr + size_t(t) * d + u * 32 + k * V::kW, x[k]);
    }
  }
  std::memset(xr + size_t(nt) * d, 0, sizeof(float) * size_t(kTileRows - nt) * size_t(d));
}

// Writes vectors a0, a1 (2·kW values) to dst[0, n), n <= 2·kW.
template <class V>
inline void store_two(float* dst, typename V::F a0, typename V::F a1, int n) {
  if (n >= 2 * V::kW) {
    V::storeu(dst, a0), V::storeu(dst + V::kW, a1);
    return;
  }
  float tmp[2 * V::kW];
  V::storeu(tmp, a0), V::storeu(tmp + V::kW, a1);
  std::memcpy(dst, tmp, sizeof(float) * size_t(n));
}

// s[i·s_stride + t] = q_i · x̂_t for QB queries and the tile's rows t < nt, from kt[c·kTileRows + t].
template <class V, int QB>
void scores_tile(const float* kt, int d, const float* q, int nt, float* s, size_t s_stride) {
  using F = typename V::F;
  constexpr int kW = V::kW;
  for (int tb = 0; tb < nt; tb += 2 * kW) {
    F a0[QB], a1[QB];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) a0[i] = V::zero(), a1[i] = V::zero();
    for (int c = 0; c < d; ++c) {
      const F k0 = V::loadu(kt + c * kTileRows + tb), k1 = V::loadu(kt + c * kTileRows + tb + kW);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        const F qv = V::bcast(q[i * d + c]);
        a0[i] = V::fma(k0, qv, a0[i]), a1[i] = V::fma(k1, qv, a1[i]);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) store_two<V>(s + i * s_stride + tb, a0[i], a1[i], nt - tb);
  }
}

// acc[i, :] += Σ_t<nt p[i·p_stride + t] · x̂_t for QB queries, from xr[t·d + c].
template <class V, int QB>
void accumulate_tile(const float* xr, int d, const float* p, size_t p_stride, int nt, float* acc) {
  using F = typename V::F;
  constexpr int kW = V::kW;
  for (int cb = 0; cb < d; cb += 2 * kW) {
    F a0[QB], a1[QB];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) a0[i] = V::loadu(acc + i * d + cb), a1[i] = V::loadu(acc + i * d + cb + kW);
    for (int t = 0; t < nt; ++t) {
      const F x0 = V::loadu(xr + t * d + cb), x1 = V::loadu(xr + t * d + cb + kW);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        const F pv = V::bcast(p[i * p_stride + t]);
        a0[i] = V::fma(x0, pv, a0[i]), a1[i] = V::fma(x1, pv, a1[i]);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) V::storeu(acc + i * d + cb, a0[i]), V::storeu(acc + i * d + cb + kW, a1[i]);
  }
}

template <class V, RowFormat Fmt>
void scores_tiled(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  alignas(64) float xr[kTileRows * kTileMaxD], kt[kTileMaxD * kTileRows];
  const int d = r.d;
  for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
    const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
    decode_tile<V, Fmt>(r, t0, nt, xr);
    for (int t = 0; t < kTileRows; t += V::kW)
      for (int c = 0; c < d; c += V::kW) V::transpose(xr + t * d + c, size_t(d), kt + c * kTileRows + t, kTileRows);
    for_query_blocks(n_q, V::kMaxQBScores, [&]<int QB>(int i0) {
      scores_tile<V, QB>(kt, d, q + size_t(i0) * d, nt, s + size_t(i0) * s_stride + t0, s_stride);
    });
  }
}

template <class V, RowFormat Fmt>
void accumulate_tiled(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  alignas(64) float xr[kTileRows * kTileMaxD];
  const int d = r.d;
  for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
    const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
    decode_tile<V, Fmt>(r, t0, nt, xr);
    for_query_blocks(n_q, V::kMaxQBScores, [&]<int QB>(int i0) {
      accumulate_tile<V, QB>(xr, d, p + size_t(i0) * p_stride + t0, p_stride, nt, acc + size_t(i0) * d);
    });
  }
}

// The row kernels of the unit formats: decode-once tiles for many queries, the per-query-block path otherwise.
template <class V, RowFormat Fmt>
void scores_impl(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  if (n_q >= kTileMinQ && r.d <= kTileMaxD)
    scores_tiled<V, Fmt>(r, q, n_q, s, s_stride);
  else
    scores_rows<V, Fmt>(r, q, n_q, s, s_stride);
}

template <class V, RowFormat Fmt>
void accumulate_impl(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  if (n_q >= kTileMinQ && r.d <= kTileMaxD)
    accumulate_tiled<V, Fmt>(r, p, p_stride, n_q, acc);
  else
    accumulate_rows<V, Fmt>(r, p, p_stride, n_q, acc);
}

#include "codecs/llamacpp/simd_blocks_impl.h"  // llama.cpp's block formats, on the helpers above

template <class V>
RowKernels row_kernels_for(RowFormat format) {
  switch (format) {
    case RowFormat::kBf16: return {scores_impl<V, RowFormat::kBf16>, accumulate_impl<V, RowFormat::kBf16>};
    case RowFormat::kF16: return {scores_impl<V, RowFormat::kF16>, accumulate_impl<V, RowFormat::kF16>};
    case RowFormat::kFp8E4m3: return {scores_impl<V, RowFormat::kFp8E4m3>, accumulate_impl<V, RowFormat::kFp8E4m3>};
    case RowFormat::kFp8E5m2: return {scores_impl<V, RowFormat::kFp8E5m2>, accumulate_impl<V, RowFormat::kFp8E5m2>};
    case RowFormat::kQ8_0: return block_row_kernels<V, RowFormat::kQ8_0>();
    case RowFormat::kQ5_0: return block_row_kernels<V, RowFormat::kQ5_0>();
    case RowFormat::kQ4_1: return block_row_kernels<V, RowFormat::kQ4_1>();
    case RowFormat::kQ4_0: return block_row_kernels<V, RowFormat::kQ4_0>();
    case RowFormat::kIq4Nl: return block_row_kernels<V, RowFormat::kIq4Nl>();
    case RowFormat::kInt2: return {scores_impl<V, RowFormat::kInt2>, accumulate_impl<V, RowFormat::kInt2>};
    case RowFormat::kInt4: return {scores_impl<V, RowFormat::kInt4>, accumulate_impl<V, RowFormat::kInt4>};
    case RowFormat::kInt8: return {scores_impl<V, RowFormat::kInt8>, accumulate_impl<V, RowFormat::kInt8>};
  }
  return {nullptr, nullptr};
}
