// bf16 / fp16 conversions: exhaustive round trips, round-to-nearest-even at every midpoint, and the shared
// host / device implementation against the host one it replaced.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/half.h"

using namespace kvq;

TEST(Half, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32(fp16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp16(f), h) << "fp16 bits " << h;
  }
}

TEST(Half, Fp16RoundsMidpointsToEven) {
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float mid = 0.5f * (fp16_to_f32(fp16_t(h)) + fp16_to_f32(fp16_t(h + 1)));
    ASSERT_EQ(f32_to_fp16(mid), (h & 1) ? h + 1 : h) << "between fp16 bits " << h << " and " << h + 1;
  }
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7c00);   // overflow saturates to +inf
  EXPECT_EQ(f32_to_fp16(-1e-9f), 0x8000);  // underflow keeps the sign
}

TEST(Half, Bf16RoundTripsAndRoundsToEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(bf16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h);
  }
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie between 1 and 1+2^-7 goes to even (1.0)
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // tie goes up to even
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

// The conversions are shared with the GPU kernels (common/hd.h: KVQ_HD, exact float operations): they must equal
// the host implementation they replaced, here verbatim, on every fp16 / bf16 edge: NaN payloads and signs,
// infinities, overflow at 65520, subnormals and their ties, bf16 ties and rounding into infinity.
namespace previous {

float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    float a;
    std::memcpy(&a, &abs, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t v = abs - 0x38000000u;
  v += 0xfffu + ((v >> 13) & 1u);
  return uint16_t(sign | (v >> 13));
}

}  // namespace previous

namespace {
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST(Half, SharedConversionsEqualThePreviousOnesOnEveryEdge) {
  std::vector<uint32_t> words = {
      0x00000000u, 0x80000000u,                            // ±0
      0x7f800000u, 0xff800000u,                            // ±inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,  // quiet / signalling NaNs with payloads
      0x7f7fffffu, 0xff7fffffu,                            // largest finite: bf16 rounds it to inf
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,  // 65504, just below / at / above 65520 (fp16 overflow)
      0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x337fffffu,  // fp16 normal / subnormal edges
      0x00000001u, 0x007fffffu, 0x00800000u,               // f32 subnormals and the smallest normal
      0x3f808000u, 0x3f818000u, 0x3f80c000u,               // bf16 ties (to even down / up) and above a tie
  };
  for (uint32_t m = 0; m < 1024; ++m)  // every fp16 subnormal and its tie with the next one, both signs
    for (uint32_t s : {0u, 0x80000000u}) {
      words.push_back(s | bits_of(float(m) * 5.9604644775390625e-8f));
      words.push_back(s | bits_of((float(m) + 0.5f) * 5.9604644775390625e-8f));
    }
  for (uint32_t u = 0; u < 0xffffffffu - 65521u; u += 65521u) words.push_back(u);  // a sweep of all f32 words
  for (uint32_t u : words) {
    const float f = float_of(u);
    ASSERT_EQ(f32_to_fp16(f), previous::f32_to_fp16(f)) << std::hex << "f32 bits 0x" << u;
    ASSERT_EQ(f32_to_bf16(f), previous::f32_to_bf16(f)) << std::hex << "f32 bits 0x" << u;
  }
  for (uint32_t h = 0; h < 65536; ++h) {  // every 16-bit word, NaNs included, bit for bit
    ASSERT_EQ(bits_of(fp16_to_f32(uint16_t(h))), bits_of(previous::fp16_to_f32(uint16_t(h)))) << "fp16 " << h;
    ASSERT_EQ(bits_of(bf16_to_f32(uint16_t(h))), bits_of(previous::bf16_to_f32(uint16_t(h)))) << "bf16 " << h;
  }
  EXPECT_EQ(f32_to_fp16(float_of(0x7fc00001u)), 0x7e00);  // NaN -> canonical fp16 NaN, sign kept
  EXPECT_EQ(f32_to_fp16(float_of(0xffc00001u)), 0xfe00);
  EXPECT_EQ(f32_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(0.5f * 5.9604644775390625e-8f), 0x0000);  // half the smallest subnormal: tie to even (0)
  EXPECT_EQ(f32_to_fp16(1.5f * 5.9604644775390625e-8f), 0x0002);  // tie to even (2)
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80);          // rounds into inf
  EXPECT_EQ(f32_to_bf16(float_of(0x7f800001u)), 0x7fc0);          // NaN stays NaN (quiet bit set)
}
