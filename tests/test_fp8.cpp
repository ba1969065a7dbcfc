// vLLM's FP8 caches (codecs/fp8/fp8.h): the e4m3 and e5m2 casts by hand (round to nearest even, saturation, NaN,
// subnormals) and exhaustively (every code round-trips, every float lands on a nearest code), the names vLLM's users
// type, the per-token-head rows against an independent reading of vLLM's quantizer, the bits they store and their
// error bounds. Fast paths against the scalar reference at every SIMD level: test_codecs.cpp (AnyCodec); the GPU's
// bytes against these: test_gpu_head_dims.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codecs/codec.h"
#include "codecs/fp8/fp8.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "simd/simd.h"
#include "test_helpers.h"

using namespace kvq;
using test::gaussian;

namespace {

CodecSpec spec(const std::string& type, int d) {
  CodecSpec s;
  s.type = type;
  s.head_dim = d;
  return s;
}

struct Case {
  float x;
  uint8_t bits;
  float back;
};

// Every finite code round-trips, and every float of a wide random sample lands on a nearest finite code.
template <class Enc, class Dec>
void expect_nearest_codes(Enc enc, Dec dec, float range, const char* what) {
  for (int b = 0; b < 256; ++b)
    if (std::isfinite(dec(uint8_t(b)))) {
      EXPECT_EQ(enc(dec(uint8_t(b))), b) << what << " code " << b;
    }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-range, range);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng) * (i % 3 == 0 ? 1e-3f : i % 3 == 1 ? 1e-5f : 1.f);
    const float q = dec(enc(x));
    float best = INFINITY;
    for (int b = 0; b < 256; ++b)
      if (std::isfinite(dec(uint8_t(b)))) best = std::min(best, std::fabs(dec(uint8_t(b)) - x));
    ASSERT_EQ(std::fabs(q - x), best) << what << " " << x;
  }
}

}  // namespace

TEST(Fp8Codecs, E4m3CastRoundsToNearestEvenAndSaturatesByHand) {
  const Case cases[] = {
      {0.f, 0x00, 0.f},        {-0.f, 0x80, -0.f},       {1.f, 0x38, 1.f},          {-2.f, 0xc0, -2.f},
      {1.0625f, 0x38, 1.f},    // halfway between 1 and 1.125: ties to even (mantissa 000)
      {1.1875f, 0x3a, 1.25f},  // halfway between 1.125 (001) and 1.25 (010): to 010
      {0.3f, 0x2a, 0.3125f},   // 0.3 = 1.2 · 2^-2: mantissa 0.2 · 8 = 1.6 rounds to 2, i.e. 1.25 · 2^-2
      {448.f, 0x7e, 448.f},    {449.f, 0x7e, 448.f},     {1e9f, 0x7e, 448.f},       {-1e9f, 0xfe, -448.f},
      {INFINITY, 0x7e, 448.f}, {-INFINITY, 0xfe, -448.f},
      {0.015625f, 0x08, 0.015625f},        // 2^-6: the smallest normal
      {0.001953125f, 0x01, 0.001953125f},  // 2^-9: the smallest subnormal
      {0.0009765625f, 0x00, 0.f},          // 2^-10: halfway to 2^-9, ties to even (0)
      {0.0029296875f, 0x02, 0.00390625f},  // 1.5 · 2^-9: ties to even (2 · 2^-9)
      {-0.005859375f, 0x83, -0.005859375f},  // -3 · 2^-9
      {240.f, 0x77, 240.f},    {232.f, 0x76, 224.f},     // 232 halfway between 224 (110) and 240 (111): to 110
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fp8::f32_to_e4m3(c.x), c.bits) << c.x;
    const float back = fp8::e4m3_to_f32(c.bits);
    EXPECT_EQ(back, c.back) << c.x;
    EXPECT_EQ(std::signbit(back), std::signbit(c.back)) << c.x;
  }
  EXPECT_EQ(fp8::f32_to_e4m3(NAN), 0x7f);
  EXPECT_TRUE(std::isnan(fp8::e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8::e4m3_to_f32(0xff)));
  expect_nearest_codes(fp8::f32_to_e4m3, fp8::e4m3_to_f32, 500.f, "e4m3");
}

TEST(Fp8Codecs, E5m2CastRoundsToNearestEvenAndSaturatesByHand) {
  const Case cases[] = {
      {0.f, 0x00, 0.f},          {-0.f, 0x80, -0.f},     {1.f, 0x3c, 1.f},       {-2.f, 0xc0, -2.f},
      {1.125f, 0x3c, 1.f},       // halfway between 1 and 1.25: ties to even (mantissa 00)
      {1.375f, 0x3e, 1.5f},      // halfway between 1.25 (01) and 1.5 (10): to 10
      {0.3f, 0x35, 0.3125f},     // 0.3 = 1.2 · 2^-2: mantissa 0.2 · 4 = 0.8 rounds to 1, i.e. 1.25 · 2^-2
      {57344.f, 0x7b, 57344.f},  {60000.f, 0x7b, 57344.f}, {1e9f, 0x7b, 57344.f}, {-1e9f, 0xfb, -57344.f},
      {INFINITY, 0x7b, 57344.f}, {-INFINITY, 0xfb, -57344.f},
      {6.103515625e-05f, 0x04, 6.103515625e-05f},   // 2^-14: the smallest normal
      {1.52587890625e-05f, 0x01, 1.52587890625e-05f},  // 2^-16: the smallest subnormal
      {7.62939453125e-06f, 0x00, 0.f},              // 2^-17: halfway to 2^-16, ties to even (0)
      {2.288818359375e-05f, 0x02, 3.0517578125e-05f},  // 1.5 · 2^-16: ties to even (2 · 2^-16)
      {448.f, 0x5f, 448.f},      {480.f, 0x60, 512.f},   // 480 halfway between 448 (11) and 512 (00, next binade): up
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fp8::f32_to_e5m2(c.x), c.bits) << c.x;
    const float back = fp8::e5m2_to_f32(c.bits);
    EXPECT_EQ(back, c.back) << c.x;
    EXPECT_EQ(std::signbit(back), std::signbit(c.back)) << c.x;
  }
  EXPECT_EQ(fp8::f32_to_e5m2(NAN), 0x7f);
  EXPECT_TRUE(std::isnan(fp8::e5m2_to_f32(0x7f)));
  EXPECT_TRUE(std::isinf(fp8::e5m2_to_f32(0x7c)));  // a code the cache never stores
  expect_nearest_codes(fp8::f32_to_e5m2, fp8::e5m2_to_f32, 60000.f, "e5m2");
}

// The GPU's widening (codecs/fp8/codec_fp8.cuh): an e5m2 code is the top byte of the fp16 of its value; an e4m3 code b
// is the fp16 of bits sign | (b & 0x7f) << 7 times 2^8, NaN apart.
TEST(Fp8Codecs, CodesWidenExactlyThroughFp16) {
  for (int b = 0; b < 256; ++b) {
    const float e5 = fp8::e5m2_to_f32(uint8_t(b)), w5 = fp16_to_f32(uint16_t(b << 8));
    EXPECT_TRUE(e5 == w5 || (std::isnan(e5) && std::isnan(w5))) << b;
    const float e4 = fp8::e4m3_to_f32(uint8_t(b));
    if ((b & 0x7f) == 0x7f) continue;
    const float w4 = fp16_to_f32(uint16_t((b & 0x80) << 8 | (b & 0x7f) << 7)) * 256.f;
    EXPECT_EQ(e4, w4) << b;
    EXPECT_EQ(std::signbit(e4), std::signbit(w4)) << b;
  }
}

TEST(Fp8Codecs, VllmNamesSelectTheRows) {
  EXPECT_EQ(codec_traits("fp8").name, "fp8e4m3");
  EXPECT_EQ(codec_traits("fp8_e4m3").name, "fp8e4m3");
  EXPECT_EQ(codec_traits("fp8_e5m2").name, "fp8e5m2");
  EXPECT_EQ(codec_traits("fp8_per_token_head").name, "fp8_per_token_head");
  EXPECT_EQ(codec_spec("fp8", true, 128, 0.f).type, "fp8e4m3");
}

TEST(Fp8Codecs, UnscaledRowsStoreOneByteAValue) {
  for (const char* type : {"fp8e4m3", "fp8e5m2"}) {
    const bool e4m3 = std::string(type) == "fp8e4m3";
    for (int d : {64, 96, 128, 256}) {
      const auto codec = make_codec(spec(type, d));
      EXPECT_EQ(codec->bytes_per_block(), size_t(d)) << type;
      EXPECT_EQ(codec->bits_per_element(), 8.0) << type;
      const std::vector<float> x = gaussian(size_t(d), 4, 3.f);
      std::vector<uint8_t> block(codec->bytes_per_block());
      std::vector<float> xh(static_cast<size_t>(d));
      codec->encode(x.data(), block.data());
      codec->decode(block.data(), xh.data());
      for (int i = 0; i < d; ++i) {
        const float xi = x[size_t(i)];
        EXPECT_EQ(block[size_t(i)], e4m3 ? fp8::f32_to_e4m3(xi) : fp8::f32_to_e5m2(xi)) << type;
        // 3 / 2 mantissa bits: relative error <= 2^-4 / 2^-3 for normal values
        if (std::fabs(xi) > 0.02f) {
          EXPECT_LE(std::fabs(xh[size_t(i)] - xi), std::fabs(xi) / (e4m3 ? 16 : 8)) << type;
        }
      }
    }
  }
}

// vLLM's per-token-head quantizer read independently: s = max(max|x| / 448, 1e-6); code = e4m3(clamp(x · (1 / s),
// ±448)); the row stores the codes, then s as a little-endian fp32.
TEST(Fp8Codecs, PerTokenHeadRowsAreVllmsQuantizerBitForBit) {
  for (int d : {64, 128, 256}) {
    const auto codec = make_codec(spec("fp8_per_token_head", d));
    ASSERT_EQ(codec->bytes_per_block(), size_t(d) + 4);
    EXPECT_DOUBLE_EQ(codec->bits_per_element(), 8.0 + 32.0 / d);
    for (float sigma : {1e-3f, 1.f, 300.f, 1e5f}) {
      std::vector<float> x = gaussian(size_t(d), uint32_t(d) + 7, sigma);
      x[3] = -40.f * sigma;  // an outlier sets the scale
      float amax = 0.f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float s = std::max(amax / 448.f, 1e-6f), inv = 1.f / s;
      std::vector<uint8_t> block(codec->bytes_per_block());
      codec->encode(x.data(), block.data());
      float stored;
      std::memcpy(&stored, block.data() + d, 4);
      EXPECT_EQ(stored, s) << d << " " << sigma;
      std::vector<float> xh(static_cast<size_t>(d));
      codec->decode(block.data(), xh.data());
      for (int i = 0; i < d; ++i) {
        const float y = std::clamp(x[size_t(i)] * inv, -448.f, 448.f);
        ASSERT_EQ(block[size_t(i)], fp8::f32_to_e4m3(y)) << d << " " << sigma << " " << i;
        EXPECT_EQ(xh[size_t(i)], fp8::e4m3_to_f32(block[size_t(i)]) * s);
      }
      EXPECT_EQ(block[3], 0xfe) << "the outlier is -448 · s";
      // half an ulp of 3 mantissa bits relative to each value, or of the subnormal step 2^-9 · s
      for (int i = 0; i < d; ++i)
        EXPECT_LE(std::fabs(xh[size_t(i)] - x[size_t(i)]),
                  std::max(std::fabs(x[size_t(i)]) / 16.f, s * 0.001953125f / 2.f) * 1.0001f);
    }
    // A zero row takes the least scale and zero codes.
    std::vector<float> zero(static_cast<size_t>(d), 0.f);
    std::vector<uint8_t> block(codec->bytes_per_block());
    codec->encode(zero.data(), block.data());
    float stored;
    std::memcpy(&stored, block.data() + d, 4);
    EXPECT_EQ(stored, 1e-6f);
    EXPECT_TRUE(std::all_of(block.begin(), block.begin() + d, [](uint8_t b) { return b == 0; }));
  }
  EXPECT_THROW(make_codec(spec("fp8_per_token_head", 80)), Error);
}

// A NaN input stores the NaN code (0x7f), and every level's fast path reads it as NaN (the widening keeps e4m3's NaN
// codes NaN; e5m2's are fp16 NaNs), beside finite rows that score as the scalar reference does.
TEST(Fp8Codecs, NanCodesReadAsNanAtEverySimdLevel) {
  for (const char* type : {"fp8e4m3", "fp8e5m2"}) {
    std::vector<float> x = gaussian(2 * 64, 9);
    x[64 + 5] = NAN;
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni}) {
      if (!simd_level_supported(level)) continue;
      const auto codec = make_codec_at(spec(type, 64), level);
      std::vector<uint8_t> blocks(2 * codec->bytes_per_block());
      codec->encode(x.data(), blocks.data());
      codec->encode(x.data() + 64, blocks.data() + codec->bytes_per_block());
      ASSERT_EQ(blocks[codec->bytes_per_block() + 5], 0x7f) << type;
      const std::vector<float> q = gaussian(64, 10);
      float s[2], ref[2];
      codec->scores(q.data(), 1, blocks.data(), 2, s);
      codec->scores_ref(q.data(), 1, blocks.data(), 2, ref);
      EXPECT_NEAR(s[0], ref[0], 1e-4f * (1.f + std::fabs(ref[0]))) << type << " " << simd_level_name(level);
      EXPECT_TRUE(std::isnan(s[1])) << type << " " << simd_level_name(level);
    }
  }
}
