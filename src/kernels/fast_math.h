// Vectorizable exp and tanh for the f32 kernels. libm's scalar expf/tanhf keep a loop
// from vectorizing, which made GELU alone a quarter of a gpt-mini step. The f64 overloads
// are libm's, so double-precision gradient checks stay exact.
//
// exp: x = n ln2 + f with |f| <= ln2/2 (ln2 split in two parts, each product subtracted in
// one fused multiply-add), e^f by its Taylor series to f^7 (truncation < 6e-9 relative) in
// Horner's form, one fused multiply-add a term, times 2^n built from the bits. Inputs are
// clamped to [-87, 88], the range where 2^n is a normal float: e^-87 ~ 1.6e-38 stands in for
// smaller results, e^88 ~ 1.65e38 for larger. Max error measured against std::exp: 1.3 ulp
// (kernels_test FastMath.ExpAndTanhAccuracy). std::fma is one IEEE operation (the
// instruction where the CPU has it, as every CPU Loom targets does), so the bits are the
// same on every compiler and CPU, as -ffp-contract=off keeps them elsewhere (the form with
// a separate multiply and add per term, 20 operations where this has 9, was 0.68 ns an
// exponential where this is 0.41 on one Zen 4 core: 2% of a bf16 gpt-mini step, in the
// attention's softmax).
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
  const float f = std::fma(n, -1.428606765330187e-06f, std::fma(n, -0.693145751953125f, x));
  float p = 1.0f / 5040.0f;  // 1/7!, then each lower term's coefficient
  p = std::fma(p, f, 1.0f / 720.0f);
  p = std::fma(p, f, 1.0f / 120.0f);
  p = std::fma(p, f, 1.0f / 24.0f);
  p = std::fma(p, f, 1.0f / 6.0f);
  p = std::fma(p, f, 0.5f);
  p = std::fma(p, f, 1.0f);
  p = std::fma(p, f, 1.0f);
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline double fast_exp(double x) { return std::exp(x); }

inline float fast_tanh(float u) { return 1.0f - 2.0f / (1.0f + fast_exp(2.0f * u)); }

inline double fast_tanh(double u) { return std::tanh(u); }

}  // namespace loom::kernels
