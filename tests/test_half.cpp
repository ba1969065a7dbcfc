// bf16 / fp16 conversions: exhaustive round trips and round-to-nearest-even at every midpoint.
#include <cmath>

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
