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
#pragma once

namespace kvq {

enum class E8Rule { kShipped, kStrict };

inline constexpr int kE8Dim = 8;  // coordinates per lattice group

// p[0..8) = the nearest point to u[0..8) under rule, every coordinate in [-half_range, half_range] (half_range = L/2,
// an integer >= 1), as half-integers (exact in float).
void e8_nearest(const float* u, int half_range, E8Rule rule, float* p);

// p[0..8) = the nearest point of {n + ½ : n ∈ Z^8, |n + ½| <= top} (top = 1.5 for e8_2's 4 levels) to u; with
// strict_parity, of the subset with Σn even (the D8 + ½ coset of E8).
void half_coset_nearest(const float* u, float top, bool strict_parity, float* p);

}  // namespace kvq
