// Straight-through INT-b group quantizer for calibration (METHODS §4, OptR).
//
// Forward: the real cache quantizer, kvq::quantize_group (src/codecs/group_quant.h, fp16 scale/zero), per group of
// `group` columns of every row, dequantized: x̂ = (code − zero)·scale. Backward (the reference code's rule): rounding
// is identity, the clip threshold thr is a constant, min/max/ scale/zero are differentiated normally. With x_c =
// clamp(x, −thr, thr), lo = x_c[i_min], hi = x_c[i_max], s = (hi − lo)/L (L = 2^b − 1), z = −lo/s and code = x_c/s + z
// + r (r the rounding residual, held fixed):
//     x̂ = (code − z)·s = x_c + r·s.
// Hence, with m_i = [|x_i| <= thr] (clamp passes x_i; decided on the float value the quantizer saw) and upstream
// gradient g = ∂L/∂x̂:
//     ∂L/∂x_i = m_i·g_i + m_i·[i == i_max]·c − m_i·[i == i_min]·c,   c = Σ_j g_j r_j / L.
// r is taken from the real forward, r = (x̂ − x_c)/s with the float s (so the fp16 rounding of the stored scale/zero is
// inside r); groups with s == 0 get r = 0 (pure pass-through). The surrogate x̂(x) = x̃ + r·(x̃[i_max] − x̃[i_min])/L,
// with x̃_i = x_i where m_i = 1 and the frozen clip value ±thr elsewhere, equals the real forward at the point where
// the state was recorded and its exact gradient is the backward above — tests check the backward against finite
// differences of this surrogate.
#pragma once

#include <cstdint>
#include <vector>

#include <Eigen/Dense>

namespace kvq {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct SteQuantSpec {
  int bits = 2;      // INT-b grid, 1..8
  int group = 128;   // columns per group; must divide the row length
  float clip = 1.f;  // quantile clip ratio r of METHODS §1 (0 < clip <= 1)
};

// Everything the backward (and the frozen surrogate) needs from one forward over a (rows, cols) matrix.
template <class T>
struct SteState {
  SteQuantSpec spec;
  int rows = 0, cols = 0;
  RowMat<T> resid;             // (rows, cols) rounding residual r = (x̂ − x_c)/s, 0 where s == 0
  RowMat<T> clip_value;        // (rows, cols) x_c at the recorded point (the frozen ±thr where mask is 0)
  std::vector<uint8_t> pass;   // (rows * cols) m_i = 1 when |x_i| <= thr (clamp passes x_i)
  std::vector<int32_t> i_min;  // (rows * n_groups) column (within the row) that set min(x_c)
  std::vector<int32_t> i_max;  // (rows * n_groups) column (within the row) that set max(x_c)
};

// Validates spec against a row length (bits 1..8, group > 0 dividing cols, 0 < clip <= 1).
void check_ste_spec(const SteQuantSpec& spec, int cols);

// Real forward: xhat = dequant(quantize(x)) per group; records the state for backward/surrogate.
template <class T>
void ste_quant_forward(const RowMat<T>& x, const SteQuantSpec& spec, RowMat<T>& xhat, SteState<T>& state);

// Frozen-state surrogate (see header comment), for finite-difference tests.
template <class T>
void ste_quant_surrogate(const RowMat<T>& x, const SteState<T>& state, RowMat<T>& xhat);

// Backward: g_x = ∂L/∂x from g_xhat = ∂L/∂x̂ (shapes as in the forward).
template <class T>
void ste_quant_backward(const SteState<T>& state, const RowMat<T>& g_xhat, RowMat<T>& g_x);

}  // namespace kvq
