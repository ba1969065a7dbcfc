// The float-tile kernels of codecs/turboquant/tq_kernels.h, written once over a 16-float GCC vector; included by
// tq_kernels.cpp inside one namespace per SIMD level, after that level's `#pragma GCC target`. No include guard and no
// #includes: everything it needs is included by tq_kernels.cpp first.

using V16 = float __attribute__((vector_size(64)));  // 16 floats: the lanes of one tile

// Vectors travel by reference: a 64-byte vector passed by value would change the ABI between the levels.
inline void load16(V16& v, const float* p) { __builtin_memcpy(&v, p, sizeof v); }
inline void store_lanes(float* p, const V16& v, int n) { __builtin_memcpy(p, &v, sizeof(float) * size_t(n)); }

// Query blocks of QB rows: the tile's column c is loaded once for QB queries.
template <int QB>
inline void scores_block(const float* q, const float* xt, int n, int d, const V16& f, float* s, size_t s_stride) {
  V16 acc[QB] = {};
  for (int c = 0; c < d; ++c) {
    V16 x;
    load16(x, xt + c * kTile);
#pragma GCC unroll 4
    for (int i = 0; i < QB; ++i) acc[i] += q[size_t(i) * d + c] * x;
  }
#pragma GCC unroll 4
  for (int i = 0; i < QB; ++i) {
    const V16 out = acc[i] * f;
    store_lanes(s + size_t(i) * s_stride, out, n);
  }
}

void scores(const float* q, int n_q, const float* xt, int n, int d, const float* f, float* s, size_t s_stride) {
  V16 fv;
  load16(fv, f);
  int i = 0;
  for (; i + 4 <= n_q; i += 4) scores_block<4>(q + size_t(i) * d, xt, n, d, fv, s + size_t(i) * s_stride, s_stride);
  for (; i < n_q; ++i) scores_block<1>(q + size_t(i) * d, xt, n, d, fv, s + size_t(i) * s_stride, s_stride);
}

// QB queries × 16 channels held in registers across the tile's rows.
template <int QB>
inline void accumulate_block(const float* w, const float* x, int n, int d, float* acc) {
  for (int c0 = 0; c0 < d; c0 += 16) {
    V16 a[QB];
#pragma GCC unroll 4
    for (int i = 0; i < QB; ++i) load16(a[i], acc + size_t(i) * d + c0);
    for (int t = 0; t < n; ++t) {
      V16 xv;
      load16(xv, x + size_t(t) * d + c0);
#pragma GCC unroll 4
      for (int i = 0; i < QB; ++i) a[i] += w[i * kTile + t] * xv;
    }
#pragma GCC unroll 4
    for (int i = 0; i < QB; ++i) __builtin_memcpy(acc + size_t(i) * d + c0, &a[i], sizeof(V16));
  }
}

void accumulate(const float* w, int n_q, const float* x, int n, int d, float* acc) {
  int i = 0;
  for (; i + 4 <= n_q; i += 4) accumulate_block<4>(w + i * kTile, x, n, d, acc + size_t(i) * d);
  for (; i < n_q; ++i) accumulate_block<1>(w + i * kTile, x, n, d, acc + size_t(i) * d);
}
