// The bf16 weights' decode-step product (simd.h, Bf16Gemv), written once over a vector-traits type V (simd_avx2.cpp,
// simd_avx512.cpp) that adds to the row kernels' traits
//   bf16_pairs(p, even, odd)  the 2·kW bf16 values at p widened exactly to fp32: even ones (0, 2, ...) and odd ones
//   kGemvRows, kGemvQB        rows × queries a pass holds in registers (2 sums each) for three queries or more
//   kGemvRowsFew              rows a pass for one or two queries (a bandwidth-bound decode step)
// Included inside each level's anonymous namespace, after the row kernels.

// Passes ahead (of R rows each) whose weight rows a pass prefetches, a line per row and block: the rows of a work
// item stream from the last-level cache or memory, and without it the next rows' loads wait (models/ref's gate_proj,
// 16 rows of x, one core: 61 -> 88 GFLOP/s; docs/results/cpu.md). Every query pass of the rows prefetches again; the
// repeats hit lines already on their way.
inline constexpr int kGemvPrefetchPasses = 2;

// y[i·y_stride + j] = W row j · query i for R rows from w and QB queries from xp (permuted: simd.h).
template <class V, int R, int QB>
void gemv_pass(const uint8_t* w, size_t stride, int in, const float* xp, float* y, size_t y_stride) {
  using F = typename V::F;
  constexpr int kB = 2 * V::kW;
  F sum[R][QB][2];
  KVQ_UNROLL
  for (int j = 0; j < R; ++j)
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) sum[j][i][0] = V::zero(), sum[j][i][1] = V::zero();
  for (int k = 0; k < in; k += kB) {
    F even[R], odd[R];
    KVQ_UNROLL
    for (int j = 0; j < R; ++j) {
      const uint8_t* p = w + j * stride + size_t(k) * 2;
      __builtin_prefetch(p + kGemvPrefetchPasses * R * stride);
      V::bf16_pairs(p, even[j], odd[j]);
    }
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) {
      const F qe = V::loadu(xp + size_t(i) * in + k), qo = V::loadu(xp + size_t(i) * in + k + V::kW);
      KVQ_UNROLL
      for (int j = 0; j < R; ++j) {
        sum[j][i][0] = V::fma(even[j], qe, sum[j][i][0]);
        sum[j][i][1] = V::fma(odd[j], qo, sum[j][i][1]);
      }
    }
  }
  KVQ_UNROLL
  for (int j = 0; j < R; ++j)
    KVQ_UNROLL
    for (int i = 0; i < QB; ++i) y[size_t(i) * y_stride + j] = V::hsum(V::add(sum[j][i][0], sum[j][i][1]));
}

// R rows against all n queries: passes of QB queries, the last n mod QB in one pass of that many.
template <class V, int R, int QB>
void gemv_rows(const uint8_t* w, size_t stride, int in, const float* xp, int n, float* y, size_t y_stride) {
  int i0 = 0;
  for (; i0 + QB <= n; i0 += QB)
    gemv_pass<V, R, QB>(w, stride, in, xp + size_t(i0) * in, y + size_t(i0) * y_stride, y_stride);
  const int left = n - i0;
  if (left == 0) return;
  [&]<int... Q>(std::integer_sequence<int, Q...>) {
    ((left == Q + 1 ? gemv_pass<V, R, Q + 1>(w, stride, in, xp + size_t(i0) * in, y + size_t(i0) * y_stride, y_stride)
                    : void()),
     ...);
  }(std::make_integer_sequence<int, QB - 1>{});
}

template <class V, int R, int QB>
void gemv_all_rows(const uint8_t* w, size_t stride, int rows, int in, const float* xp, int n, float* y,
                   size_t y_stride) {
  int r = 0;
  for (; r + R <= rows; r += R) gemv_rows<V, R, QB>(w + size_t(r) * stride, stride, in, xp, n, y + r, y_stride);
  for (; r < rows; ++r) gemv_rows<V, 1, QB>(w + size_t(r) * stride, stride, in, xp, n, y + r, y_stride);
}

template <class V>
void bf16_gemv_for(const uint8_t* w, size_t stride, int rows, int in, const float* xp, int n, float* y,
                   size_t y_stride) {
  if (n <= 2)
    gemv_all_rows<V, V::kGemvRowsFew, 2>(w, stride, rows, in, xp, n, y, y_stride);
  else
    gemv_all_rows<V, V::kGemvRows, V::kGemvQB>(w, stride, rows, in, xp, n, y, y_stride);
}
