#include "parallel/exact_sum.h"

#include <cmath>


namespace loom::parallel {
namespace {

constexpr double kTwo64 = 18446744073709551616.0;  // 2^64
constexpr double kRange = 2147483648.0;            // 2^31

}  // namespace

int64_t exact_accumulate(const float* x, int64_t* acc, int64_t n) {
  int64_t first_out = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!(std::fabs(v) < kRange)) {
      if (first_out < 0) first_out = i;
      continue;
    }
    if (v == 0) continue;
    // x * 2^64 is exact in double; its integer part fits in 95 bits.
    const auto q = static_cast<__int128>(std::nearbyint(static_cast<double>(v) * kTwo64));
    int64_t* a = acc + kLimbs * i;
    a[0] += static_cast<int64_t>(q & 0xffffffff);
    a[1] += static_cast<int64_t>((q >> 32) & 0xffffffff);
    a[2] += static_cast<int64_t>(q >> 64);
  }
  return first_out;
}

void exact_decode(const int64_t* acc, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* a = acc + kLimbs * i;
    const __int128 q = static_cast<__int128>(a[2]) * (static_cast<__int128>(1) << 64) +
                       static_cast<__int128>(a[1]) * (int64_t{1} << 32) + a[0];
    // One rounding (int128 -> f32), then an exact scaling by a power of two.
    out[i] = std::ldexp(static_cast<float>(q), -64);
  }
}

void exact_accumulate_squares(const float* x, int64_t n, int64_t* acc) {
  // x^2 < 2^62 (|x| < 2^31, checked when the gradients were summed), so q < 2^158.
  for (int64_t i = 0; i < n; ++i) {
    const double sq = static_cast<double>(x[i]) * x[i];  // exact: 48 significant bits
    if (sq == 0) continue;
    int exp = 0;
    const double mant = std::frexp(sq, &exp);  // sq = mant * 2^exp, mant in [0.5, 1)
    // sq * 2^96 = m53 * 2^(exp + 96 - 53) with m53 a 53-bit integer.
    const auto m53 = static_cast<uint64_t>(std::ldexp(mant, 53));
    const int shift = exp + 96 - 53;  // bit position of m53's lowest bit
    if (shift <= -53) continue;       // below the resolution
    __int128 lo = shift >= 0 ? 0 : static_cast<__int128>(m53 >> -shift);
    if (shift >= 0) {
      // Spread m53 << shift over the 32-bit limbs.
      const int limb = shift / 32, bit = shift % 32;
      const unsigned __int128 v = static_cast<unsigned __int128>(m53) << bit;
      for (int k = 0; k < 3 && limb + k < kSquareLimbs; ++k)
        acc[limb + k] += static_cast<int64_t>((v >> (32 * k)) & 0xffffffff);
    } else {
      acc[0] += static_cast<int64_t>(lo & 0xffffffff);
      acc[1] += static_cast<int64_t>((lo >> 32) & 0xffffffff);
    }
  }
}

double exact_decode_squares(const int64_t* acc) {
  // Normalize carries so every limb but the top one is in [0, 2^32), then sum from the top:
  // a fixed function of the integer, so every rank and layout gets the same double.
  int64_t limbs[kSquareLimbs];
  int64_t carry = 0;
  for (int k = 0; k < kSquareLimbs; ++k) {
    const int64_t v = acc[k] + carry;
    limbs[k] = k + 1 < kSquareLimbs ? (v & 0xffffffff) : v;
    carry = k + 1 < kSquareLimbs ? (v >> 32) : 0;
  }
  double r = 0;
  for (int k = kSquareLimbs; k-- > 0;) r += std::ldexp(static_cast<double>(limbs[k]), 32 * k - 96);
  return r;
}

}  // namespace loom::parallel
