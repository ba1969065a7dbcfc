// The online softmax's row primitives (max, exp-and-sum; simd/simd.h SoftmaxKernels) written once over the
// vector-traits type V of simd_kernels_impl.h; included the same way, after it, by simd_scalar.cpp,
// simd_avx2.cpp and simd_avx512.cpp INSIDE `namespace kvq { namespace {`. No #includes here (INFINITY: <cmath>).
//
// Besides F, kW, zero, loadu, storeu, bcast, fma, add and hsum, V provides: sub(a, b), mul(a, b), min(a, b) and
// max(a, b) (a < b ? a : b and a > b ? a : b, as minps / maxps), fnma(a, b, c) = c - a·b, round(a) (to nearest
// even), exp2i(n) = 2^n built in the exponent bits (n integral, <= 127; any value below -126), zero_below(x, lo, y)
// = y where x >= lo and 0 elsewhere (also where x is NaN), hmax(F), and load_partial(p, n, fill) / store_partial(p, v, n) for the lanes [0, n) of
// one vector, 0 < n < kW (lanes >= n read as fill, and are not written).

// exp(x) as Cephes expf: x = n·ln2 + r, |r| <= ln2/2 (ln2 split in a high part exact in n·ln2_hi and a low part),
// exp(r) = 1 + r + r²·P(r) with P of degree 5, times 2^n. x is clamped to kExpMaxX so that 2^n stays a normal
// float; x < kExpMinX (and -inf, whose r is NaN) gives 0 through zero_below, so the low side needs no clamp.
constexpr float kExpLog2e = 1.44269504088896341f, kExpLn2Hi = 0.693359375f, kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f,
                kExpP3 = 4.1665795894e-2f, kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
constexpr float kExpMinX = -87.3f, kExpMaxX = 88.3f;  // n = round(x·log2e) in [-126, 127]

template <class V>
inline typename V::F exp_cephes(typename V::F x) {  // inline: called once per vector in the loops below
  using F = typename V::F;
  const F xc = V::min(x, V::bcast(kExpMaxX));
  const F n = V::round(V::mul(xc, V::bcast(kExpLog2e)));
  F r = V::fnma(n, V::bcast(kExpLn2Hi), xc);
  r = V::fnma(n, V::bcast(kExpLn2Lo), r);
  F p = V::bcast(kExpP0);
  p = V::fma(p, r, V::bcast(kExpP1));
  p = V::fma(p, r, V::bcast(kExpP2));
  p = V::fma(p, r, V::bcast(kExpP3));
  p = V::fma(p, r, V::bcast(kExpP4));
  p = V::fma(p, r, V::bcast(kExpP5));
  p = V::fma(p, V::mul(r, r), V::add(r, V::bcast(1.f)));
  return V::zero_below(x, V::bcast(kExpMinX), V::mul(p, V::exp2i(n)));
}

// max of x[0, n); -inf for n == 0
template <class V>
float softmax_max_impl(const float* x, int n) {
  typename V::F m = V::bcast(-INFINITY);
  int i = 0;
  for (; i + V::kW <= n; i += V::kW) m = V::max(m, V::loadu(x + i));
  if (i < n) m = V::max(m, V::load_partial(x + i, n - i, -INFINITY));
  return V::hmax(m);
}

// x[i] <- exp(x[i] - m) for i < n; returns the sum of the new x
template <class V>
float softmax_exp_sum_impl(float* x, int n, float m) {
  using F = typename V::F;
  const F mv = V::bcast(m);
  F sum = V::zero();
  int i = 0;
  for (; i + V::kW <= n; i += V::kW) {
    const F e = exp_cephes<V>(V::sub(V::loadu(x + i), mv));
    V::storeu(x + i, e);
    sum = V::add(sum, e);
  }
  if (i < n) {  // the tail's missing lanes read -inf, whose exp is 0
    const F e = exp_cephes<V>(V::sub(V::load_partial(x + i, n - i, -INFINITY), mv));
    V::store_partial(x + i, e, n - i);
    sum = V::add(sum, e);
  }
  return V::hsum(sum);
}

template <class V>
SoftmaxKernels softmax_kernels_for() {
  return {softmax_max_impl<V>, softmax_exp_sum_impl<V>};
}
