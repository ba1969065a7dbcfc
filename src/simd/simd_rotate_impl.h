// The exact row rotation (simd.h: RotateRowsFn), written once over a double-vector traits type D; included inside
// the anonymous namespace of a level's file, after its target pragma. D provides:
//   V, kW            a vector of kW doubles
//   zero(), bcast(const double*), fma(a, b, c)
//   tile(R, d, a0, b0, t)     t[j] = R[a0 + j][b0 .. b0 + kW) as doubles, j < kW     (x · R)
//   tile_t(R, d, a0, b0, t)   t[j] = R[b0 .. b0 + kW)[a0 + j] as doubles, j < kW     (x · R^T: R's rows are its columns)
//   store(float*, V)          kW doubles rounded to float
// A block of kRows rows and kCols vectors of output columns is held in registers; each tile of R is read once per
// block of rows, and the rows are widened to double once (a broadcast is then a load, not a shuffle). Every output
// column sums its products in the order a = 0 .. d-1, so the block shape does not change the result: it is the scalar
// loop's, bit for bit.

template <class D, bool Transpose, int NR>
void rotate_block(float* const* rows, const float* R, int d) {
  using V = typename D::V;
  constexpr int kW = D::kW, kC = D::kCols;
  alignas(64) double x[NR][kMaxRotationDim];  // the rows' inputs: the outputs overwrite the rows as they come
  for (int r = 0; r < NR; ++r)
    for (int a = 0; a < d; ++a) x[r][a] = rows[r][a];
  for (int b0 = 0; b0 < d; b0 += kC * kW) {
    V acc[NR][kC];
    KVQ_UNROLL for (int r = 0; r < NR; ++r) KVQ_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = D::zero();
    for (int a0 = 0; a0 < d; a0 += kW) {
      V t[kC][kW];
      KVQ_UNROLL for (int c = 0; c < kC; ++c) {
        if constexpr (Transpose) D::tile_t(R, d, a0, b0 + c * kW, t[c]);
        else D::tile(R, d, a0, b0 + c * kW, t[c]);
      }
      KVQ_UNROLL for (int j = 0; j < kW; ++j) KVQ_UNROLL for (int r = 0; r < NR; ++r) {
        const V xa = D::bcast(&x[r][a0 + j]);
        KVQ_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = D::fma(xa, t[c][j], acc[r][c]);
      }
    }
    KVQ_UNROLL for (int r = 0; r < NR; ++r) KVQ_UNROLL for (int c = 0; c < kC; ++c)
      D::store(rows[r] + b0 + c * kW, acc[r][c]);
  }
}

template <class D, bool Transpose>
void rotate_rows_as(float* const* rows, int n_rows, const float* R, int d) {
  constexpr int kRows = D::kRows;
  int i = 0;
  for (; i + kRows <= n_rows; i += kRows) rotate_block<D, Transpose, kRows>(rows + i, R, d);
  switch (n_rows - i) {  // kRows <= 4
    case 3: rotate_block<D, Transpose, 3>(rows + i, R, d); break;
    case 2: rotate_block<D, Transpose, 2>(rows + i, R, d); break;
    case 1: rotate_block<D, Transpose, 1>(rows + i, R, d); break;
    default: break;
  }
}

// Levels above scalar take d a multiple of kCols · kW up to kMaxRotationDim; the scalar loop the rest.
template <class D>
void rotate_rows_for(float* const* rows, int n_rows, const float* R, int d, bool transpose) {
  static_assert(D::kRows <= 4);
  if (d % (D::kCols * D::kW) != 0 || d > kMaxRotationDim) return rotate_rows_scalar(rows, n_rows, R, d, transpose);
  transpose ? rotate_rows_as<D, true>(rows, n_rows, R, d) : rotate_rows_as<D, false>(rows, n_rows, R, d);
}
