#include "codecs/nexus/e8_lattice.h"

#include <cmath>

#include "common/hd.h"

namespace kvq {

namespace {

float dist2(const float* u, const float* p) {
  float s = 0.f;
  for (int i = 0; i < kE8Dim; ++i) s += (u[i] - p[i]) * (u[i] - p[i]);
  return s;
}

// The nearest point of {n + offset : n ∈ Z^8, lo <= n_i <= hi, Σn even when parity} to u: each coordinate rounded to
// its nearest in-box grid value; an odd sum moves the one coordinate whose next-nearest in-box value costs the least
// extra squared error (away from the box edges: the largest rounding error, Conway–Sloane).
void coset_in_box(const float* u, float offset, int lo, int hi, bool parity, float* p) {
  int n[kE8Dim], sum = 0;
  for (int i = 0; i < kE8Dim; ++i) {
    const float t = exact::round_even(u[i] - offset);
    n[i] = t < float(lo) ? lo : (t > float(hi) ? hi : int(t));
    sum += n[i];
  }
  if (parity && (sum & 1)) {
    int best = -1, best_n = 0;
    float best_cost = INFINITY;
    for (int i = 0; i < kE8Dim; ++i) {
      const float e = u[i] - offset - float(n[i]);
      const int step = e >= 0.f ? 1 : -1;  // towards u_i (up when u_i sits on the grid)
      int alt = n[i] + step;
      if (alt < lo || alt > hi) alt = n[i] - step;
      const float ea = u[i] - offset - float(alt);
      const float cost = ea * ea - e * e;
      if (cost < best_cost) best = i, best_n = alt, best_cost = cost;
    }
    n[best] = best_n;
  }
  for (int i = 0; i < kE8Dim; ++i) p[i] = float(n[i]) + offset;
}

// The shipped integer candidate: round, and on an odd sum move the coordinate with the smallest rounding error.
void shipped_integer(const float* u, float* r) {
  int sum = 0;
  for (int i = 0; i < kE8Dim; ++i) {
    r[i] = exact::round_even(u[i]);
    sum += int(r[i]);
  }
  if (!(sum & 1)) return;
  int k = 0;
  for (int i = 1; i < kE8Dim; ++i)
    if (std::fabs(u[i] - r[i]) < std::fabs(u[k] - r[k])) k = i;  // argmin, first on ties
  r[k] += u[k] - r[k] >= 0.f ? 1.f : -1.f;
}

}  // namespace

void e8_nearest(const float* u, int half_range, E8Rule rule, float* p) {
  float a[kE8Dim], b[kE8Dim];
  if (rule == E8Rule::kStrict) {
    coset_in_box(u, 0.f, -half_range, half_range, true, a);
    coset_in_box(u, 0.5f, -half_range, half_range - 1, true, b);  // n + ½ within ±(L/2 - ½)
    const float* best = dist2(u, b) < dist2(u, a) ? b : a;
    for (int i = 0; i < kE8Dim; ++i) p[i] = best[i];
    return;
  }
  shipped_integer(u, a);
  for (int i = 0; i < kE8Dim; ++i) b[i] = exact::round_even(u[i] - 0.5f) + 0.5f;
  const float* best = dist2(u, b) < dist2(u, a) ? b : a;
  const float hr = float(half_range);
  for (int i = 0; i < kE8Dim; ++i) p[i] = best[i] < -hr ? -hr : (best[i] > hr ? hr : best[i]);
}

void half_coset_nearest(const float* u, float top, bool strict_parity, float* p) {
  const int hi = int(top - 0.5f);  // top = hi + ½, bottom = -(hi + 1) + ½
  coset_in_box(u, 0.5f, -hi - 1, hi, strict_parity, p);
}

}  // namespace kvq
