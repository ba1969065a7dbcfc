// Row kernels of the KV codecs: dot products and weighted sums read straight from packed rows
// (layout.h), and the online softmax's row max and exp-and-sum; one implementation per instruction-set
// level, written once over a vector-traits type (simd_kernels_impl.h, simd_softmax_impl.h), chosen at run time.
//
// The project is compiled without -mavx flags: the AVX2+FMA and AVX-512 kernels are compiled under
// `#pragma GCC target` in their own files (simd_avx2.cpp, simd_avx512.cpp) and only called after
// __builtin_cpu_supports said yes. Tests and benchmarks force a level through row_kernels(fmt, level) and
// softmax_kernels(level).
//
// Math (per row t, group g with fp16 scale s and zero z, x̂ = (code - z)·s):
//   scores:     q·x̂ = Σ_g s_g·(q_g·code_g) - Σ_g s_g·z_g·Σq_g      (Σq_g precomputed per query and group)
//   accumulate: acc += Σ_t w_t,g·code_t - Σ_t w_t,g·z_t,g           (w = p·s; the zero term subtracted once)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

// For the SIMD kernels (simd_*.cpp): fixed-trip loops over the query block and the vectors of a unit must be unrolled
// so that their arrays of vectors live in registers (-O2 does not unroll by itself).
#define KVQ_UNROLL _Pragma("GCC unroll 16")

namespace kvq {

// kAvx512Vnni (needs VNNI and VBMI): the int formats use integer dot products (vpdpwssd) with q / weights rounded
// to int16 (relative error ~2^-16 of the largest element per group or tile), except int2 rows of one 128-value
// group, which round them to int8 (vpdpbusd, 1/254); bf16 uses the kAvx512 float kernels.
enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

const char* simd_level_name(SimdLevel level);
bool simd_level_supported(SimdLevel level);  // this CPU can run it
SimdLevel best_simd_level();                  // the highest supported level
// Throws kvq::Error naming the level and this CPU's best unless the CPU supports it: the check of every kernel table.
void require_simd_level(SimdLevel level);
// Whether the level's int2 kernels for rows of one 128-value group round q / weights to int8 (AVX2 and AVX-512 VNNI:
// relative 1/254 of the largest element) rather than int16 or float: the tests' budgets follow it.
inline bool simd_int8_operands(SimdLevel level) {
  return level == SimdLevel::kAvx2 || level == SimdLevel::kAvx512Vnni;
}

// The level of a --simd value ("scalar", "avx2", "avx512", "avx512vnni"; "" or "best": best_simd_level()). Throws
// kvq::Error naming the levels for an unknown name, and naming what this CPU has for a level it lacks.
SimdLevel parse_simd_level(std::string_view name);
// "scalar, avx2, avx512, avx512vnni": the levels this CPU (and this build) can run, lowest first.
std::string supported_simd_levels();

// How the values of one row are stored: bf16 / f16 values, int codes after GroupParams (layout.h), llama.cpp's
// blocks of 32 values, each with its own fp16 scale (codecs/llamacpp/llamacpp_blocks.h; kernels in simd_blocks_impl.h),
// or FP8 values (codecs/fp8/fp8.h: e4m3, e5m2; a row's scale, if any, is the codec's to apply).
enum class RowFormat : int {
  kBf16 = 0, kInt2 = 1, kInt4 = 2, kInt8 = 3,
  kF16 = 4, kQ8_0 = 5, kQ5_0 = 6, kQ4_1 = 7, kQ4_0 = 8, kIq4Nl = 9,
  kFp8E4m3 = 10, kFp8E5m2 = 11,
};

// n_rows rows of d values, row t at rows + t·row_stride.
struct RowsView {
  const uint8_t* rows = nullptr;  // first row
  size_t row_stride = 0;          // bytes between consecutive rows
  int codes_offset = 0;           // bytes from a row's start to its values / packed codes
  int d = 0;                      // values per row (multiple of 32; <= 256 for grouped rows)
  int group = 0;                  // values per GroupParams group (grouped rows); d otherwise
  bool grouped = false;           // rows start with GroupParams[d / group] (int rows); false: plain values or
                                  // llama.cpp blocks (group 32)
  int n_rows = 0;                 // rows to read
};

// s[i·s_stride + t] = q[i, :] · x̂_t       q: [n_q, d] contiguous
using ScoresFn = void (*)(const RowsView& rows, const float* q, int n_q, float* s, size_t s_stride);
// acc[i, :] += Σ_t p[i·p_stride + t] · x̂_t   acc: [n_q, d] contiguous
using AccumulateFn = void (*)(const RowsView& rows, const float* p, size_t p_stride, int n_q, float* acc);

struct RowKernels {
  ScoresFn scores;
  AccumulateFn accumulate;
};

// The kernels of one format at one level. Throws kvq::Error if this CPU does not support the level.
RowKernels row_kernels(RowFormat format, SimdLevel level);

// Per-level tables (one per file); used only by row_kernels.
RowKernels row_kernels_scalar(RowFormat format);
RowKernels row_kernels_avx2(RowFormat format);
RowKernels row_kernels_avx2_int(RowFormat format);  // int2 / int4 / int8 at AVX2 (simd_avx2_int.cpp): integer dots
RowKernels row_kernels_avx512(RowFormat format);
RowKernels row_kernels_avx512_vnni(RowFormat format);

// The row primitives of the online softmax in attention/attention.cpp: max and exp-and-sum over one row of
// scores, written once over the same vector traits as the row kernels (simd_softmax_impl.h).
//
// The levels compute exp with a Cephes-style polynomial: x = n·ln2 + r, |r| <= ln2/2, degree-6 polynomial in r,
// times 2^n built in the exponent bits. Relative error <= 2e-7 (about 2 float ulp) against std::exp for x in
// [-87, 0]; inputs below -87.3 give 0 (std::exp gives < 1.2e-38 there). Attention only calls exp on
// x = s - max <= 0, so the results are weights in [0, 1].
struct SoftmaxKernels {
  float (*max)(const float* x, int n);         // max of x[0, n); -inf for n == 0
  float (*exp_sum)(float* x, int n, float m);  // x[i] <- exp(x[i] - m) for i < n; returns the sum of the new x
};

// The softmax primitives at one level (kAvx512Vnni uses the kAvx512 ones). Throws kvq::Error if this CPU does
// not support the level.
SoftmaxKernels softmax_kernels(SimdLevel level);

// Per-level tables (one per file); used only by softmax_kernels.
SoftmaxKernels softmax_kernels_scalar();
SoftmaxKernels softmax_kernels_avx2();
SoftmaxKernels softmax_kernels_avx512();

// The scalar reference twins, the spec of every level (plain loops, std::exp).
float softmax_max_ref(const float* x, int n);
float softmax_exp_sum_ref(float* x, int n, float m);

// The bf16 weights' product of a decode step (model/linear.cpp, n <= 16 query rows): y[i·y_stride + r] = Σ_k W[r, k] ·
// x[i, k] for the rows r < rows of W (bf16, row r at w + r·row_stride, `in` values). A vector of kW 32-bit lanes
// loaded from 2·kW bf16 weights holds them in pairs, value 2l in lane l's low half and 2l + 1 in its high half: the
// even values widened exactly are the lanes shifted left by 16, the odd ones the lanes with the low half cleared — two
// integer operations for 2·kW weights, where widening them in order takes a shuffle and a shift for every kW. The
// kernel reads x permuted to match (bf16_gemv_permute: in each block of 2·kW values, the even ones, then the odd
// ones). Each (row, query) sums its even and its odd products in a vector each, over the blocks in order, and adds the
// two before one horizontal sum: the same operations whatever rows and queries share a pass, so at one level a row of
// a batched step is the row alone bit for bit.
struct Bf16Gemv {
  int block = 0;  // values per permuted block of x (2·kW); 0: no kernel at this level (the row kernels serve)
  void (*run)(const uint8_t* w, size_t row_stride, int rows, int in, const float* xp, int n, float* y,
              size_t y_stride) = nullptr;
};
// The kernel of one level (none at kScalar; kAvx512Vnni uses kAvx512's). Throws kvq::Error if this CPU lacks it.
Bf16Gemv bf16_gemv_kernel(SimdLevel level);
Bf16Gemv bf16_gemv_avx2();  // per-level kernels (one per file); used only by bf16_gemv_kernel
Bf16Gemv bf16_gemv_avx512();
// xp = x [n, in] permuted for a kernel of `block` (in % block == 0): each block's even values, then its odd ones.
void bf16_gemv_permute(const float* x, int n, int in, int block, float* xp);

// The rotations of keys, values, queries and outputs (kv/transform.h): rows[i] <- rows[i] · R (transpose:
// rows[i] · R^T), R [d, d] row-major, in place. Exact to one rounding per value: every output sums its d products
// in double, in the order a = 0 .. d-1, and rounds once to float. The product of two floats is exact in double, so a
// fused multiply-add gives what a multiply and an add give: every level returns the same bits, and so does the GPU
// (cuda/kv_append.cu). AVX2 takes d a multiple of 8, AVX-512 a multiple of 16, up to kMaxRotationDim; other d go to
// the scalar loop.
inline constexpr int kMaxRotationDim = 512;
using RotateRowsFn = void (*)(float* const* rows, int n_rows, const float* R, int d, bool transpose);
// The kernel of one level (kAvx512Vnni uses the kAvx512 one). Throws kvq::Error if this CPU does not support it.
RotateRowsFn rotate_rows_kernel(SimdLevel level);

// Per-level kernels (one per file); used only by rotate_rows_kernel. The scalar one is the reference.
void rotate_rows_scalar(float* const* rows, int n_rows, const float* R, int d, bool transpose);
void rotate_rows_avx2(float* const* rows, int n_rows, const float* R, int d, bool transpose);
void rotate_rows_avx512(float* const* rows, int n_rows, const float* R, int d, bool transpose);

}  // namespace kvq

namespace kvq {
struct CodecSpec;
class KvCodec;
// make_codec (codec.h) with the codec's scores()/accumulate() forced to `level` (tests, benchmarks).
// Throws kvq::Error if the CPU does not support the level or the spec is not supported.
std::unique_ptr<KvCodec> make_codec_at(const CodecSpec& spec, SimdLevel level);
}  // namespace kvq
