// The CPU linear layer (model/linear.h): every weight dtype (bf16, f16, f32, read where they lie) and path (row
// kernels, widened tiles + sgemm, sgemv) against a float64 reference on the same values, and which path each takes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/half.h"
#include "model/linear.h"
#include "model/safetensors.h"
#include "simd/simd.h"

namespace kvq {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, bool bf16_exact) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_exact ? bf16_to_f32(f32_to_bf16(nd(rng))) : nd(rng);
  return v;
}

// y = x Wᵀ + b in float64.
std::vector<double> reference(const std::vector<float>& x, int n, const std::vector<float>& w, int out, int in,
                              const std::vector<float>& bias) {
  std::vector<double> y(size_t(n) * out);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[size_t(o)];
      for (int c = 0; c < in; ++c) s += double(x[size_t(i) * in + c]) * w[size_t(o) * in + c];
      y[size_t(i) * out + o] = s;
    }
  return y;
}

void expect_close(const std::vector<float>& y, const std::vector<double>& ref, int in) {
  // fp32 dot products of `in` terms of unit-variance products: the error grows like sqrt(in) ulps of the sum.
  const double tol = 1e-5 * std::sqrt(double(in));
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], tol * (1 + std::abs(ref[i]))) << "at " << i;
}

// A [out, in] weight of `dtype` over `bytes` (which must outlive it) holding w's values (exact for bf16-rounded w).
WeightTensor tensor_of(const std::vector<float>& w, int out, int in, DType dtype, std::vector<uint8_t>& bytes) {
  bytes = OwnedTensor::from_f32("w", dtype, {out, in}, w).bytes;
  WeightTensor t;
  t.dtype = dtype, t.rows = out, t.cols = in, t.data = bytes.data();
  return t;
}

// Every path of a weight dtype: the row kernels for decode steps (n <= kGemvRows) when in % 32 == 0, widened tiles +
// sgemm otherwise (one tile, or K slices and row blocks past kTileFloats), sgemv / sgemm in place for f32.
TEST(Linear, EveryDtypeAndPathMatchesTheReference) {
  ThreadPool pool(2);
  struct Shape {
    int out, in;
  };
  // 200: not a multiple of the 64-row work items; 80: a row the row kernels cannot read (head_dim 80's o_proj); the
  // last two hold more than kTileFloats weights: in <= out, blocks of whole rows (the last one partial); in > out,
  // slices of 16 x kSliceK columns (as many as kTileFloats holds for 1000 rows; the last one partial).
  const int big_out = int(Linear::kTileFloats / Linear::kSliceK) + 37, big_in = Linear::kSliceK + 96;
  for (Shape sh : {Shape{200, 32}, Shape{200, 384}, Shape{200, 1280}, Shape{70, 80}, Shape{big_out, big_in},
                   Shape{1000, 16 * Linear::kSliceK + 808}})
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(sh.out) + "x" + std::to_string(sh.in));
      const bool rounded = dt != DType::F32;
      auto w = random_vec(size_t(sh.out) * sh.in, 1, rounded);
      if (dt == DType::F16)
        for (float& x : w) x = fp16_to_f32(f32_to_fp16(x));
      const auto bias = random_vec(size_t(sh.out), 2, false);
      std::vector<uint8_t> bytes;
      const Linear lin(tensor_of(w, sh.out, sh.in, dt, bytes), bias);
      EXPECT_EQ(lin.reads_rows(), dt != DType::F32 && sh.in % 32 == 0);
      EXPECT_EQ(lin.decode_bytes(), size_t(sh.out) * sh.in * dtype_size(dt));
      const bool big = size_t(sh.out) * sh.in > Linear::kTileFloats;
      for (int n : big ? std::vector<int>{1, 20} : std::vector<int>{1, 3, Linear::kGemvRows, Linear::kGemvRows + 1}) {
        const auto x = random_vec(size_t(n) * sh.in, 3 + n, false);
        std::vector<float> y(size_t(n) * sh.out);
        lin.apply(x.data(), n, y.data(), pool);
        if (!big) {
          expect_close(y, reference(x, n, w, sh.out, sh.in, bias), sh.in);
          continue;
        }
        // 9M-10M weights: the reference of every output of the first and the last row (each block and slice).
        for (int i : {0, n - 1})
          for (int o = 0; o < sh.out; ++o) {
            double r = bias[size_t(o)];
            for (int c = 0; c < sh.in; ++c) r += double(x[size_t(i) * sh.in + c]) * w[size_t(o) * sh.in + c];
            ASSERT_NEAR(y[size_t(i) * sh.out + o], r, 1e-5 * std::sqrt(double(sh.in)) * (1 + std::abs(r)))
                << "row " << i << " output " << o;
          }
      }
    }
}

// Prefill of a W of at most kTileFloats is the one sgemm that fp32 weights make: bit for bit the same result.
TEST(Linear, Bf16PrefillOfAWholeTileIsTheFp32SgemmBitForBit) {
  ThreadPool pool(2);
  const int out = 1280, in = 384, n = 97;
  const auto w = random_vec(size_t(out) * in, 8, true), x = random_vec(size_t(n) * in, 9, false);
  std::vector<uint8_t> b16, b32;
  const Linear lin16(tensor_of(w, out, in, DType::BF16, b16)), lin32(tensor_of(w, out, in, DType::F32, b32));
  std::vector<float> y16(size_t(n) * out), y32(size_t(n) * out);
  lin16.apply(x.data(), n, y16.data(), pool);
  lin32.apply(x.data(), n, y32.data(), pool);
  EXPECT_EQ(y16, y32);
}

// A row of a batched decode step (up to kGemvRows rows through the row kernels, which read ungrouped rows 4 at a time
// for 4 or more queries at AVX-512) is bit for bit the row alone (one query: one row at a time), at every SIMD level
// this CPU has: the batch a sequence shares a step with never changes its logits. 203 rows: work items of 64 and a
// last one of 11, so tiles end in 1-3 rows of the one-row tail.
TEST(Linear, ARowOfABatchedStepIsTheRowAloneBitForBitAtEveryLevel) {
  ThreadPool pool(2);
  const int out = 203;
  int levels = 0;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni}) {
    if (!simd_level_supported(level)) continue;
    ++levels;
    for (DType dt : {DType::BF16, DType::F16})
      for (int in : {96, 1280}) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(dt)) + " in " + std::to_string(in));
        const auto w = random_vec(size_t(out) * in, 7, true);
        std::vector<uint8_t> bytes;
        const Linear lin(tensor_of(w, out, in, dt, bytes), {}, level);
        ASSERT_TRUE(lin.reads_rows());
        for (int n : {4, 7, Linear::kGemvRows}) {
          const auto x = random_vec(size_t(n) * in, 11 + n, false);
          std::vector<float> y(size_t(n) * out), y1(out);
          lin.apply(x.data(), n, y.data(), pool);
          const auto ref = reference(x, n, w, out, in, {});
          for (int i = 0; i < n; ++i) {
            lin.apply(x.data() + size_t(i) * in, 1, y1.data(), pool);
            for (int o = 0; o < out; ++o)
              ASSERT_EQ(std::bit_cast<uint32_t>(y[size_t(i) * out + o]), std::bit_cast<uint32_t>(y1[size_t(o)]))
                  << "n " << n << " row " << i << " output " << o << ": " << y[size_t(i) * out + o] << " vs "
                  << y1[size_t(o)] << " (reference " << ref[size_t(i) * out + o] << ")";
          }
          expect_close(y, ref, in);
        }
      }
  }
  EXPECT_GE(levels, 1);
}

}  // namespace
}  // namespace kvq
