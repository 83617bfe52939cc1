#include "loom/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace loom {
namespace {

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_name(DType::kU16), "u16");
  EXPECT_EQ(safetensors_dtype_name(DType::kF32), "F32");
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_safetensors("Q4").has_value());
}

// bf16 keeps the top 16 bits of an f32; ties round to the even mantissa.
TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: rounds to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to 2^16 rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);              // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);              // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

// Every f16 value converts to f32 and back unchanged; same for every bf16 non-NaN value.
TEST(DType, HalfRoundTripsExhaustively) {
  for (uint32_t h = 0; h < 65536; ++h) {
    auto x = static_cast<uint16_t>(h);
    float f = f16_to_f32(x);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_f16(f), x) << h;
    }
    float b = bf16_to_f32(x);
    if (!std::isnan(b)) {
      ASSERT_EQ(f32_to_bf16(b), x) << h;
    }
  }
}

// Against the double-precision definition: the result is the nearest f16, ties to even.
TEST(DType, F16MatchesNearestOnRandomValues) {
  uint32_t s = 12345;
  for (int i = 0; i < 200000; ++i) {
    s = s * 1664525u + 1013904223u;
    float f = std::bit_cast<float>((s & 0x8fffffffu) | 0x30000000u);  // magnitudes ~1e-9..1e5
    if (std::fabs(f) >= 65504.0f) continue;
    uint16_t h = f32_to_f16(f);
    double got = f16_to_f32(h);
    double lo = f16_to_f32(static_cast<uint16_t>(h - 1 + ((h & 0x7fff) == 0 ? 1 : 0)));
    double hi = f16_to_f32(static_cast<uint16_t>(h + 1));
    double err = std::fabs(got - f);
    ASSERT_LE(err, std::fabs(lo - f)) << f;
    ASSERT_LE(err, std::fabs(hi - f)) << f;
  }
}

}  // namespace
}  // namespace loom
