// Portable row kernels and softmax primitives (no intrinsics): the same algorithm as the SIMD levels with one
// float per "vector".
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "codecs/fp8/fp8.h"
#include "codecs/layout.h"
#include "codecs/llamacpp/llamacpp_blocks.h"
#include "common/half.h"
#include "simd/simd.h"

namespace kvq {
namespace {

struct VScalar {
  using F = float;
  static constexpr int kW = 1, kMaxQBScores = 8, kMaxQBAcc = 8;
  static constexpr int kScoreChains = 4, kMaxQBRowScores = 8;
  static F zero() { return 0.f; }
  static F loadu(const float* p) { return *p; }
  static void storeu(float* p, F v) { *p = v; }
  static F bcast(float x) { return x; }
  static F fma(F a, F b, F c) { return a * b + c; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F fnma(F a, F b, F c) { return c - a * b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F max(F a, F b) { return a > b ? a : b; }
  static F round(F a) { return std::rint(a); }
  static F exp2i(F n) { return n >= -126.f ? std::bit_cast<float>(uint32_t(int(n) + 127) << 23) : 0.f; }
  static F zero_below(F x, F lo, F y) { return x >= lo ? y : 0.f; }
  static F load_partial(const float* p, int n, float fill) { return n > 0 ? *p : fill; }  // kW = 1: unused
  static void store_partial(float* p, F v, int n) {
    if (n > 0) *p = v;
  }
  static float hsum(F v) { return v; }
  static void hsum4(const F* v, float* out) {
    for (int j = 0; j < 4; ++j) out[j] = v[j];
  }
  static float hmax(F v) { return v; }
  static void transpose(const float* src, size_t, float* dst, size_t) { *dst = *src; }  // a 1 × 1 block
  static float half(uint16_t h) { return fp16_to_f32(h); }
  template <RowFormat Fmt>
  static void unit(const uint8_t* p, F* out) {
    if constexpr (Fmt == RowFormat::kBf16) {
      for (int v = 0; v < 32; ++v) {
        uint16_t b;
        std::memcpy(&b, p + 2 * v, 2);
        out[v] = bf16_to_f32(b);
      }
    } else if constexpr (Fmt == RowFormat::kF16) {
      for (int v = 0; v < 32; ++v) {
        uint16_t h;
        std::memcpy(&h, p + 2 * v, 2);
        out[v] = fp16_to_f32(h);
      }
    } else if constexpr (Fmt == RowFormat::kFp8E4m3) {
      for (int v = 0; v < 32; ++v) out[v] = fp8::e4m3_to_f32(p[v]);
    } else if constexpr (Fmt == RowFormat::kFp8E5m2) {
      for (int v = 0; v < 32; ++v) out[v] = fp8::e5m2_to_f32(p[v]);
    } else {
      constexpr int bits = Fmt == RowFormat::kInt2 ? 2 : Fmt == RowFormat::kInt4 ? 4 : 8;
      for (int v = 0; v < 32; ++v) out[v] = float(layout::unpack_code(p, v, bits));
    }
  }
  template <RowFormat Fmt>
  static void block(const uint8_t* p, F* out) {
    if constexpr (Fmt == RowFormat::kQ8_0) levels<llamacpp::BlockQ8_0>(p, out);
    else if constexpr (Fmt == RowFormat::kQ5_0) levels<llamacpp::BlockQ5_0>(p, out);
    else if constexpr (Fmt == RowFormat::kQ4_1) levels<llamacpp::BlockQ4_1>(p, out);
    else if constexpr (Fmt == RowFormat::kQ4_0) levels<llamacpp::BlockQ4_0>(p, out);
    else levels<llamacpp::BlockIq4Nl>(p, out);
  }
  template <class Block>
  static void levels(const uint8_t* p, F* out) {
    Block b;
    std::memcpy(&b, p, sizeof b);
    for (int j = 0; j < 32; ++j) out[j] = float(llamacpp::level(b, j));
  }
};

#include "simd/simd_kernels_impl.h"
#include "simd/simd_softmax_impl.h"

}  // namespace

RowKernels row_kernels_scalar(RowFormat format) { return row_kernels_for<VScalar>(format); }
SoftmaxKernels softmax_kernels_scalar() { return softmax_kernels_for<VScalar>(); }

void rotate_rows_scalar(float* const* rows, int n_rows, const float* R, int d, bool transpose) {
  std::vector<double> acc(static_cast<size_t>(d));
  for (int i = 0; i < n_rows; ++i) {
    float* x = rows[i];
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int a = 0; a < d; ++a) {
      const double xa = x[a];
      for (int b = 0; b < d; ++b) acc[size_t(b)] += xa * double(transpose ? R[size_t(b) * d + a] : R[size_t(a) * d + b]);
    }
    for (int b = 0; b < d; ++b) x[b] = float(acc[size_t(b)]);
  }
}

}  // namespace kvq
