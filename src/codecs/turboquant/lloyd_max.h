// The Lloyd–Max codebook of TurboQuant's keys (docs/guide/methods.md §5.2 step 3), generated for a head_dim, not
// pasted: the optimal 2^b-level scalar quantizer of N(0, 1/d) (one coordinate of a rotated unit vector), solved in
// float64 as vLLM's solver does, then rounded to fp32:
//   σ = 1/√d; start from the 2^b midpoints of equal cells of [-3.5σ, 3.5σ] (c_i = lo + (hi - lo)(i + 0.5) / 2^b);
//   repeat at most 200 times: cell edges = [-10.5σ, the midpoints between neighbours, +10.5σ]; each new centroid
//   = ∫ x pdf / ∫ pdf over its cell (trapezoid rule, 200 intervals per cell; a cell of mass <= 1e-15 keeps its
//   centroid); stop, keeping the current centroids, once no centroid moves by 1e-10 or more.
// The decision midpoints are (c_i + c_{i+1}) / 2 of the fp32 centroids, computed in fp32 (as vLLM's backend does).
#pragma once

#include <vector>

namespace kvq {

struct LloydMaxCodebook {
  int head_dim = 0, bits = 0;
  std::vector<float> centroids;  // [2^bits] ascending, symmetric about 0
  std::vector<float> midpoints;  // [2^bits - 1] decision boundaries
  int iterations = 0;            // update steps taken (200 = the cap, b = 4 at d = 128 stops there)
  bool converged = false;        // stopped by the 1e-10 tolerance rather than the cap
};

// The solver itself (milliseconds). d >= 1, bits in [1, 8].
LloydMaxCodebook solve_lloyd_max(int head_dim, int bits);

// The codebook of (head_dim, bits), solved once per process and shared by every codec of that shape (a memo of a
// pure function behind a mutex; the reference stays valid for the process's lifetime).
const LloydMaxCodebook& lloyd_max_codebook(int head_dim, int bits);

}  // namespace kvq
