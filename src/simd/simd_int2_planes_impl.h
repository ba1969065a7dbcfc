// What the int2 plane kernels (rows of one 128-value group) of the AVX2 and AVX-512 VNNI levels share: included inside
// the anonymous namespace of simd_avx2_int.cpp and simd_avx512_vnni.cpp after their target pragma (AVX2 + F16C
// instructions only).
//   - plane_row_params: the rows' fp16 scales and zeros as floats, 8 rows gathered at a time (the accumulate's);
//   - scale_plane_sums: the last step of the scores. The kernels leave each row's integer sums Σ q8·code of up to four
//     queries in a tile buffer, [row][query]; it turns them into scores 8 rows at a time — the 8 rows' scales and
//     zeros as vectors, the sums transposed to one vector per query — instead of one row at a time:
//       s = scale · (Σ · step − zero · step Σq8)
//     with the same float operations per element as a row at a time (the one-row tail keeps them too).

// The fp16 scale and zero (GroupParams) of 8 rows, row_stride bytes apart, as floats.
inline void plane_params8(const uint8_t* row0, int row_stride, __m256& sc, __m256& zr) {
  const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(row_stride));
  const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row0), offsets, 1);
  const __m256i low = _mm256_set1_epi32(0xffff);
  // per 128-bit lane [scales of 4 rows | zeros of 4 rows], then [8 scales | 8 zeros]
  const __m256i h =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(v, low), _mm256_srli_epi32(v, 16)), 0xd8);
  sc = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), zr = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// The scale and zero of rows [0, n) as floats, zero from n up to n_pad.
inline void plane_row_params(const RowsView& rows, int n, int n_pad, float* sc, float* zr) {
  int t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 s8, z8;
    plane_params8(rows.rows + size_t(t) * rows.row_stride, int(rows.row_stride), s8, z8);
    _mm256_storeu_ps(sc + t, s8), _mm256_storeu_ps(zr + t, z8);
  }
  for (; t < n; ++t) {
    const layout::GroupParams gp = row_params(rows.rows + size_t(t) * rows.row_stride, 0);
    sc[t] = _cvtsh_ss(gp.scale), zr[t] = _cvtsh_ss(gp.zero);
  }
  for (; t < n_pad; ++t) sc[t] = 0.f, zr[t] = 0.f;
}

// s[i · s_stride + t0 + t] for rows t < nt of the tile and queries i < QB, from sums[t][i] (32-byte aligned rows of 4)
// and each query's rounding (the level's PlaneQuery: step, and sum = Σq8).
template <int QB, class Query>
void scale_plane_sums(const RowsView& r, int t0, int nt, const int32_t (*sums)[4], const Query* pq, float* s,
                      size_t s_stride) {
  float step[4], zsum[4];  // per query: step, step · Σq8
  for (int i = 0; i < QB; ++i) step[i] = pq[i].step, zsum[i] = pq[i].step * float(pq[i].sum);
  int t = 0;
  for (; t + 8 <= nt; t += 8) {
    __m256 sc, zr;
    plane_params8(r.rows + size_t(t0 + t) * r.row_stride, int(r.row_stride), sc, zr);
    // v_j = [row t+2j: q0 .. q3 | row t+2j+1: q0 .. q3] -> per query [rows t, t+2, t+4, t+6 | t+1, t+3, t+5, t+7]
    __m256 v[4];
    KVQ_UNROLL
    for (int j = 0; j < 4; ++j) v[j] = _mm256_load_ps(reinterpret_cast<const float*>(sums[t + 2 * j]));
    const __m256 a0 = _mm256_unpacklo_ps(v[0], v[1]), a1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 a2 = _mm256_unpacklo_ps(v[2], v[3]), a3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 by_query[4] = {_mm256_shuffle_ps(a0, a2, 0x44), _mm256_shuffle_ps(a0, a2, 0xee),
                                _mm256_shuffle_ps(a1, a3, 0x44), _mm256_shuffle_ps(a1, a3, 0xee)};
    const __m256i row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) {
      const __m256 x = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(_mm256_castps_si256(by_query[i]), row_order));
      const __m256 res =
          _mm256_mul_ps(sc, _mm256_fnmadd_ps(zr, _mm256_set1_ps(zsum[i]), _mm256_mul_ps(x, _mm256_set1_ps(step[i]))));
      _mm256_storeu_ps(s + i * s_stride + t0 + t, res);
    }
  }
  for (; t < nt; ++t) {
    const layout::GroupParams gp = row_params(r.rows + size_t(t0 + t) * r.row_stride, 0);
    const float sc = _cvtsh_ss(gp.scale), zr = _cvtsh_ss(gp.zero);
    for (int i = 0; i < QB; ++i) s[i * s_stride + t0 + t] = sc * std::fma(-zr, zsum[i], float(sums[t][i]) * step[i]);
  }
}
