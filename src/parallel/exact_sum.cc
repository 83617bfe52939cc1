#include "parallel/exact_sum.h"

#include <bit>
#include <cmath>

// Integer arithmetic on the values' bits throughout: the conversions between double and
// __int128 that the definitions suggest are libgcc calls (__fixdfti, __floattisf, scalbn)
// costing tens of ns an element, most of a deterministic step's accumulation. The results
// are those conversions' bits (round to nearest even), checked against them for every f32.
namespace loom::parallel {
namespace {

constexpr float kRange = 2147483648.0f;  // 2^31

// round(|m| * 2^shift) to nearest, ties to even, for m < 2^53 and shift < 128 - 53.
unsigned __int128 scaled(uint64_t m, int shift) {
  if (shift >= 0) return static_cast<unsigned __int128>(m) << shift;
  const int k = -shift;
  if (k > 63) return 0;  // below half of the last unit (m < 2^53 <= 2^(k - 1))
  const uint64_t q = m >> k, rest = m & ((uint64_t{1} << k) - 1), half = uint64_t{1} << (k - 1);
  return q + (rest > half || (rest == half && (q & 1)));
}

// The f32 nearest to q * 2^-64 (ties to even), as static_cast<float>(q) then ldexp(-64).
float to_float(__int128 q) {
  // Most sums fit in an int64, which converts in one instruction (nearest even).
  if (q == static_cast<int64_t>(q)) return static_cast<float>(static_cast<int64_t>(q)) * 0x1p-64f;
  const bool negative = q < 0;
  const unsigned __int128 u = negative ? -static_cast<unsigned __int128>(q) : static_cast<unsigned __int128>(q);
  const auto hi = static_cast<uint64_t>(u >> 64), lo = static_cast<uint64_t>(u);
  // Past int64, u >= 2^63: its highest set bit is 63-127, so 40-104 bits go.
  const int top = hi != 0 ? 127 - std::countl_zero(hi) : 63 - std::countl_zero(lo);
  const int exp = top - 23;
  uint64_t m = static_cast<uint64_t>(u >> exp);  // u rounded to 24 significant bits: m * 2^exp
  const unsigned __int128 rest = u & ((static_cast<unsigned __int128>(1) << exp) - 1);
  const unsigned __int128 half = static_cast<unsigned __int128>(1) << (exp - 1);
  if (rest > half || (rest == half && (m & 1))) ++m;  // may carry to 2^24: still exact
  // m * 2^(exp - 64): m is exact in f32, and so is the power of two (exp - 64 in [-24, 40]).
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(exp - 64 + 127) << 23);
  const float v = static_cast<float>(m) * scale;
  return negative ? -v : v;
}

}  // namespace

int64_t exact_accumulate(const float* x, int64_t* acc, int64_t n) {
  int64_t first_out = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!(std::fabs(v) < kRange)) {
      if (first_out < 0) first_out = i;
      continue;
    }
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    const uint32_t biased = (bits >> 23) & 0xff;
    if (biased == 0) continue;  // zero or subnormal: |v| * 2^64 < 2^-62 rounds to 0
    // |v| = (2^23 + fraction) * 2^(biased - 150), so round(|v| * 2^64) < 2^95.
    const uint64_t m = (bits & 0x7fffff) | 0x800000;
    const unsigned __int128 u = scaled(m, static_cast<int>(biased) - 150 + 64);
    const __int128 q = (bits >> 31) ? -static_cast<__int128>(u) : static_cast<__int128>(u);
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
    out[i] = to_float(q);  // one rounding, then an exact scaling by 2^-64
  }
}

void exact_accumulate_squares(const float* x, int64_t n, int64_t* acc) {
  // x^2 < 2^62 (|x| < 2^31, checked when the gradients were summed), so q < 2^158.
  for (int64_t i = 0; i < n; ++i) {
    const double sq = static_cast<double>(x[i]) * x[i];  // exact: 48 significant bits
    if (sq == 0) continue;
    // sq is a normal double (at least 2^-298): sq = m53 * 2^(biased - 1075), m53 a 53-bit
    // integer; times 2^96 that is m53 * 2^shift.
    const uint64_t bits = std::bit_cast<uint64_t>(sq);
    const uint64_t m53 = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
    const int shift = static_cast<int>(bits >> 52) - 1075 + 96;  // bit position of m53's lowest bit
    if (shift <= -53) continue;                                 // below the resolution
    if (shift >= 0) {
      // Spread m53 << shift over the 32-bit limbs.
      const int limb = shift / 32, bit = shift % 32;
      const unsigned __int128 v = static_cast<unsigned __int128>(m53) << bit;
      for (int k = 0; k < 3 && limb + k < kSquareLimbs; ++k)
        acc[limb + k] += static_cast<int64_t>((v >> (32 * k)) & 0xffffffff);
    } else {
      const uint64_t lo = m53 >> -shift;  // truncated: below 2^-96 is dropped
      acc[0] += static_cast<int64_t>(lo & 0xffffffff);
      acc[1] += static_cast<int64_t>(lo >> 32);
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
