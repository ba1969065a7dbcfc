// Row kernels of llama.cpp's block formats (q8_0, q5_0, q4_1, q4_0, iq4_nl; codecs/llamacpp/llamacpp_blocks.h), written
// once over the vector traits V of simd_kernels_impl.h, which includes this fragment (inside each level's anonymous
// namespace) and whose tiles, query blocks and prefetches it reuses. No #includes here.
//
// A row is d / 32 blocks of block_bytes<Fmt>() bytes, each with its own fp16 scale d_b (and q4_1's min m_b) in front of
// its codes; V::block<Fmt>(block, F out[32 / kW]) turns one block's codes into their levels (x̂ = d_b·level, + m_b for
// q4_1) as floats. The scale is applied once per block and query, as the int rows apply theirs per group:
//   scores:     q·x̂ = Σ_b d_b·(q_b·level_b) + Σ_b m_b·Σq_b
//   accumulate: acc_b += Σ_t (p_t·d_t,b)·level_t,b + Σ_t p_t·m_t,b

template <RowFormat Fmt>
constexpr int block_bytes() {
  return Fmt == RowFormat::kQ8_0   ? int(sizeof(llamacpp::BlockQ8_0))
         : Fmt == RowFormat::kQ5_0 ? int(sizeof(llamacpp::BlockQ5_0))
         : Fmt == RowFormat::kQ4_1 ? int(sizeof(llamacpp::BlockQ4_1))
         : Fmt == RowFormat::kQ4_0 ? int(sizeof(llamacpp::BlockQ4_0))
                                   : int(sizeof(llamacpp::BlockIq4Nl));
}
constexpr bool block_has_min(RowFormat f) { return f == RowFormat::kQ4_1; }

// The block's fp16 field at byte offset `at` (0: d; 2: q4_1's m), as a float.
template <class V>
inline float block_half(const uint8_t* block, int at) {
  uint16_t h;
  std::memcpy(&h, block + at, 2);
  return V::half(h);
}

// Scores of rows [t0, t0+nt) for QB queries. qsum[i][b] = Σ of query i over block b (q4_1 only).
template <class V, RowFormat Fmt, int QB>
void block_scores_tile(const RowsView& r, int t0, int nt, const float* q, const float (*qsum)[kMaxGroups], float* s,
                       size_t s_stride) {
  using F = typename V::F;
  constexpr int kU = 32 / V::kW, kB = block_bytes<Fmt>();
  const int d = r.d, nb = d / 32;
  float buf[QB][kTileRows];  // written out row by row at the end (4K aliasing, as scores_block)
  for (int t = t0; t < t0 + nt; ++t) {
    const uint8_t* row = r.rows + size_t(t) * r.row_stride;
    prefetch_row(r, t + kPrefetchRows);
    F tot[QB];
    float mterm[QB];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) tot[i] = V::zero(), mterm[i] = 0.f;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* block = row + b * kB;
      F x[kU];
      V::template block<Fmt>(block, x);
      F acc[QB];
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        acc[i] = V::zero();
        KVQ_UNROLL
        for (int k = 0; k < kU; ++k) acc[i] = V::fma(x[k], V::loadu(q + i * d + b * 32 + k * V::kW), acc[i]);
      }
      const F scale = V::bcast(block_half<V>(block, 0));
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) tot[i] = V::fma(acc[i], scale, tot[i]);
      if constexpr (block_has_min(Fmt)) {
        const float m = block_half<V>(block, 2);
        KVQ_UNROLL
        for (int i = 0; i < QB; ++i) mterm[i] += m * qsum[i][b];
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) buf[i][t - t0] = V::hsum(tot[i]) + mterm[i];
  }
  for (int i = 0; i < QB; ++i) std::memcpy(s + i * s_stride + t0, buf[i], sizeof(float) * size_t(nt));
}

template <class V, RowFormat Fmt>
void block_scores(const RowsView& r, const float* q, int n_q, float* s, size_t s_stride) {
  const int d = r.d;
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    float qsum[kChunkQ][kMaxGroups] = {};
    if constexpr (block_has_min(Fmt))
      for (int i = 0; i < nc; ++i)
        for (int c = 0; c < d; ++c) qsum[i][c / 32] += q[size_t(c0 + i) * d + c];
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for_query_blocks(nc, V::kMaxQBScores, [&]<int QB>(int i0) {
        block_scores_tile<V, Fmt, QB>(r, t0, nt, q + size_t(c0 + i0) * d, qsum + i0, s + size_t(c0 + i0) * s_stride,
                                      s_stride);
      });
    }
  }
}

// acc[i, :] += Σ_t w[t][b][i] · level_t for rows [t0, t0+nt); w = p·d per row, block and query.
template <class V, RowFormat Fmt, int QB>
void block_accumulate_tile(const RowsView& r, int t0, int nt, const float (*w)[kMaxGroups][kChunkQ], float* acc) {
  using F = typename V::F;
  constexpr int kU = 32 / V::kW, kB = block_bytes<Fmt>();
  const int d = r.d;
  for (int b = 0; b < d / 32; ++b) {
    F a[QB][kU];
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < kU; ++k) a[i][k] = V::loadu(acc + i * d + b * 32 + k * V::kW);
    const uint8_t* block = r.rows + size_t(t0) * r.row_stride + b * kB;
    for (int t = 0; t < nt; ++t, block += r.row_stride) {
      prefetch_unit(r, t0 + t + kPrefetchTiles * kTileRows, b * kB);
      F x[kU];
      V::template block<Fmt>(block, x);
      KVQ_UNROLL
      for (int i = 0; i < QB; ++i) {
        const F wv = V::bcast(w[t][b][i]);
        KVQ_UNROLL
        for (int k = 0; k < kU; ++k) a[i][k] = V::fma(x[k], wv, a[i][k]);
      }
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i)
      KVQ_UNROLL
      for (int k = 0; k < kU; ++k) V::storeu(acc + i * d + b * 32 + k * V::kW, a[i][k]);
  }
}

template <class V, RowFormat Fmt>
void block_accumulate(const RowsView& r, const float* p, size_t p_stride, int n_q, float* acc) {
  constexpr int kB = block_bytes<Fmt>();
  const int d = r.d, nb = d / 32;
  for (int c0 = 0; c0 < n_q; c0 += kChunkQ) {
    const int nc = n_q - c0 < kChunkQ ? n_q - c0 : kChunkQ;
    double msum[kChunkQ][kMaxGroups] = {};  // q4_1: Σ_t p·m per query and block
    float w[kTileRows][kMaxGroups][kChunkQ];
    for (int t0 = 0; t0 < r.n_rows; t0 += kTileRows) {
      const int nt = r.n_rows - t0 < kTileRows ? r.n_rows - t0 : kTileRows;
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = r.rows + size_t(t0 + t) * r.row_stride;
        for (int b = 0; b < nb; ++b) {
          const float scale = block_half<V>(row + b * kB, 0);
          for (int i = 0; i < nc; ++i) w[t][b][i] = p[size_t(c0 + i) * p_stride + t0 + t] * scale;
          if constexpr (block_has_min(Fmt)) {
            const float m = block_half<V>(row + b * kB, 2);
            for (int i = 0; i < nc; ++i) msum[i][b] += double(p[size_t(c0 + i) * p_stride + t0 + t]) * m;
          }
        }
      }
      for_query_blocks(nc, V::kMaxQBAcc, [&]<int QB>(int i0) {
        const auto* wi = reinterpret_cast<const float(*)[kMaxGroups][kChunkQ]>(&w[0][0][i0]);
        block_accumulate_tile<V, Fmt, QB>(r, t0, nt, wi, acc + size_t(c0 + i0) * d);
      });
    }
    if constexpr (block_has_min(Fmt))
      for (int i = 0; i < nc; ++i)
        for (int c = 0; c < d; ++c) acc[size_t(c0 + i) * d + c] += float(msum[i][c / 32]);
  }
}

template <class V, RowFormat Fmt>
RowKernels block_row_kernels() {
  return {block_scores<V, Fmt>, block_accumulate<V, Fmt>};
}
