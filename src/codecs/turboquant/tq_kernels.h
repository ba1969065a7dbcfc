// The float-tile kernels behind the TurboQuant codecs' fast paths (codecs/turboquant/codec_turboquant.cpp): a tile of
// up to kTile rows is decoded once into floats (byte tables), then every query reads the tile with one vectorised
// multiply-add per value, no per-element decode and no horizontal sums. One implementation (tq_kernels_impl.h, GCC
// vector extensions over 16 floats), compiled per SIMD level in tq_kernels.cpp: 4 SSE, 2 AVX2 or 1 AVX-512 register.
#pragma once

#include <cstddef>

#include "simd/simd.h"

namespace kvq::tq {

constexpr int kTile = 16;  // rows per tile: one vector of 16 lanes across the tile's rows

struct TileKernels {
  // Scores of a transposed tile: s[i·s_stride + t] = f[t] · Σ_c q[i·d + c] · xt[c·kTile + t] for i < n_q, t < n
  // (n <= kTile; xt: [d][kTile], lanes t >= n zero).
  void (*scores)(const float* q, int n_q, const float* xt, int n, int d, const float* f, float* s, size_t s_stride);
  // Weighted sum of a row-major tile: acc[i·d + c] += Σ_{t < n} w[i·kTile + t] · x[t·d + c] for i < n_q
  // (x: [kTile][d], w: [n_q][kTile]).
  void (*accumulate)(const float* w, int n_q, const float* x, int n, int d, float* acc);
};

// The kernels of a level (kScalar: the portable SSE2 build; kAvx512Vnni uses the AVX-512 ones). Throws kvq::Error if
// this CPU does not support the level.
TileKernels tile_kernels(SimdLevel level);

}  // namespace kvq::tq
