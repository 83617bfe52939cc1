// Vectorizable exp and tanh for the f32 kernels. libm's scalar expf/tanhf keep a loop
// from vectorizing, which made GELU alone a quarter of a gpt-mini step. The f64 overloads
// are libm's, so double-precision gradient checks stay exact.
//
// exp: x = n ln2 + f with |f| <= ln2/2 (ln2 split in two parts, so n ln2 is exact), e^f by
// its Taylor series to f^7 (truncation < 6e-9 relative), times 2^n built from the bits.
// Inputs are clamped to [-87, 88], the range where 2^n is a normal float: e^-87 ~ 1.6e-38
// stands in for smaller results, e^88 ~ 1.65e38 for larger. Max error measured against
// std::exp: 2 ulp (fast_math_test in kernels_test.cc).
// tanh(u) = 1 - 2 / (1 + e^{2u}): absolute error ~1e-7, which is what GELU needs.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::kernels {

inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (floorf would keep GCC from
  // vectorizing the loop unless trapping math is off).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float f = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f + f * (1.0f / 7.0f);
  p = 1.0f + f * (1.0f / 6.0f) * p;
  p = 1.0f + f * (1.0f / 5.0f) * p;
  p = 1.0f + f * (1.0f / 4.0f) * p;
  p = 1.0f + f * (1.0f / 3.0f) * p;
  p = 1.0f + f * (1.0f / 2.0f) * p;
  p = 1.0f + f * p;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline double fast_exp(double x) { return std::exp(x); }

inline float fast_tanh(float u) { return 1.0f - 2.0f / (1.0f + fast_exp(2.0f * u)); }

inline double fast_tanh(double u) { return std::tanh(u); }

}  // namespace loom::kernels
