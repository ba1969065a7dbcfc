// Nearest points of NexusQuant's 8-dimensional lattice quantizer (docs/guide/methods.md §5.3), on one group u[0..8) of
// scaled coordinates (|u_i| <= L/2). Rounding is round-half-to-even everywhere (torch.round; exact::round_even).
//
// E8 = D8 ∪ (D8 + ½·1), D8 = integer points with an even coordinate sum. Two rules:
//
// kShipped — what the NexusQuant code does (nexusquant/core/e8_lattice.py, the vLLM backend), the reference:
//   A: r = round(u); if Σr is odd, re-round the coordinate with the SMALLEST rounding error |u_i - r_i| (first index on
//      ties) one step towards u_i (+1 when u_i == r_i).
//   B: r = round(u - ½) + ½, no parity check (the shipped check can never fire): the point set is D8 ∪ (Z + ½)^8.
//   Keep B if its squared distance is strictly smaller, else A; then clamp every coordinate to [-L/2, L/2] (the clamp
//   may leave a mixed or odd point: that is the shipped behaviour).
//
// kStrict — Conway–Sloane's nearest point of E8 (the labelled ablation), within the box [-L/2, L/2]^8 so that no
//   clamp can break the coset afterwards:
//   per coset C (D8: offset 0, coordinates in [-L/2, L/2]; D8 + ½: offset ½, in [-(L/2 - ½), L/2 - ½]) round each
//   coordinate to the nearest value of C's grid inside the box; if Σ(r - offset) is odd, move the one coordinate whose
//   next-nearest in-box grid value costs the least extra squared error there (first index on ties). Away from the box
//   edges that is Conway–Sloane's rule (the coordinate with the LARGEST rounding error, re-rounded the other way); at
//   the edges it is still the exact nearest point of C ∩ box. Keep the closer coset (ties → D8).
//
// The 2-bit format e8_2 uses the half-integer coset alone with 4 levels {-1.5, -0.5, 0.5, 1.5}: half_coset_nearest,
// independent rounding (relaxed, the shipped relaxation) or the strict coset's parity.
//
// Shared by the host and the GPU's demotion (codecs/nexus/codec_nexus.cuh): KVQ_HD, every float operation an exact
// IEEE one (common/hd.h), so both store the same points.
#pragma once

#include "common/hd.h"

namespace kvq {

enum class E8Rule { kShipped, kStrict };

inline constexpr int kE8Dim = 8;  // coordinates per lattice group

namespace e8_detail {

KVQ_HD inline float dist2(const float* u, const float* p) {
  float s = 0.f;
  for (int i = 0; i < kE8Dim; ++i) {
    const float e = exact::sub(u[i], p[i]);
    s = exact::add(s, exact::mul(e, e));
  }
  return s;
}

// The nearest point of {n + offset : n ∈ Z^8, lo <= n_i <= hi, Σn even when parity} to u: each coordinate rounded to
// its nearest in-box grid value; an odd sum moves the one coordinate whose next-nearest in-box value costs the least
// extra squared error (away from the box edges: the largest rounding error, Conway–Sloane).
KVQ_HD inline void coset_in_box(const float* u, float offset, int lo, int hi, bool parity, float* p) {
  int n[kE8Dim], sum = 0;
  for (int i = 0; i < kE8Dim; ++i) {
    const float t = exact::round_even(exact::sub(u[i], offset));
    n[i] = t < float(lo) ? lo : (t > float(hi) ? hi : int(t));
    sum += n[i];
  }
  if (parity && (sum & 1)) {
    int best = -1, best_n = 0;
    float best_cost = INFINITY;
    for (int i = 0; i < kE8Dim; ++i) {
      const float e = exact::sub(exact::sub(u[i], offset), float(n[i]));
      const int step = e >= 0.f ? 1 : -1;  // towards u_i (up when u_i sits on the grid)
      int alt = n[i] + step;
      if (alt < lo || alt > hi) alt = n[i] - step;
      const float ea = exact::sub(exact::sub(u[i], offset), float(alt));
      const float cost = exact::sub(exact::mul(ea, ea), exact::mul(e, e));
      if (cost < best_cost) best = i, best_n = alt, best_cost = cost;
    }
    n[best] = best_n;
  }
  for (int i = 0; i < kE8Dim; ++i) p[i] = exact::add(float(n[i]), offset);
}

// The shipped integer candidate: round, and on an odd sum move the coordinate with the smallest rounding error.
KVQ_HD inline void shipped_integer(const float* u, float* r) {
  int sum = 0;
  for (int i = 0; i < kE8Dim; ++i) {
    r[i] = exact::round_even(u[i]);
    sum += int(r[i]);
  }
  if (!(sum & 1)) return;
  int k = 0;
  for (int i = 1; i < kE8Dim; ++i)
    if (exact::abs(exact::sub(u[i], r[i])) < exact::abs(exact::sub(u[k], r[k]))) k = i;  // argmin, first on ties
  r[k] = exact::add(r[k], exact::sub(u[k], r[k]) >= 0.f ? 1.f : -1.f);
}

}  // namespace e8_detail

// p[0..8) = the nearest point to u[0..8) under rule, every coordinate in [-half_range, half_range] (half_range = L/2,
// an integer >= 1), as half-integers (exact in float).
KVQ_HD inline void e8_nearest(const float* u, int half_range, E8Rule rule, float* p) {
  float a[kE8Dim], b[kE8Dim];
  if (rule == E8Rule::kStrict) {
    e8_detail::coset_in_box(u, 0.f, -half_range, half_range, true, a);
    e8_detail::coset_in_box(u, 0.5f, -half_range, half_range - 1, true, b);  // n + ½ within ±(L/2 - ½)
    const float* best = e8_detail::dist2(u, b) < e8_detail::dist2(u, a) ? b : a;
    for (int i = 0; i < kE8Dim; ++i) p[i] = best[i];
    return;
  }
  e8_detail::shipped_integer(u, a);
  for (int i = 0; i < kE8Dim; ++i) b[i] = exact::add(exact::round_even(exact::sub(u[i], 0.5f)), 0.5f);
  const float* best = e8_detail::dist2(u, b) < e8_detail::dist2(u, a) ? b : a;
  const float hr = float(half_range);
  for (int i = 0; i < kE8Dim; ++i) p[i] = best[i] < -hr ? -hr : (best[i] > hr ? hr : best[i]);
}

// p[0..8) = the nearest point of {n + ½ : n ∈ Z^8, |n + ½| <= top} (top = 1.5 for e8_2's 4 levels) to u; with
// strict_parity, of the subset with Σn even (the D8 + ½ coset of E8).
KVQ_HD inline void half_coset_nearest(const float* u, float top, bool strict_parity, float* p) {
  const int hi = int(top - 0.5f);  // top = hi + ½, bottom = -(hi + 1) + ½
  e8_detail::coset_in_box(u, 0.5f, -hi - 1, hi, strict_parity, p);
}

}  // namespace kvq
