// Mixed precision (docs/numerics.md, "Mixed precision"): rounding f32 values to the values
// bf16 or f16 can hold, and moving them to and from 16-bit storage. Every conversion rounds
// to nearest, ties to even, as loom/core/dtype.h's scalar ones (the reference twins): NaN stays
// NaN, f16 overflows to infinity, f16's subnormals are kept.
// Thread-safety: reentrant; large arrays use the OpenMP pool (kernels/parallel.h).
#pragma once

#include <bit>
#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

// bf16: the upper half of the f32 bits, rounded to nearest even; a NaN keeps its sign and
// becomes quiet. Branch-free, so the loops vectorize. bf16_upper leaves the result where it
// was, in the upper half of a 32-bit lane over zeros: the f32 that the bf16 value is, with
// no narrowing to 16-bit lanes and widening back between (a vectorized f32 -> bf16 -> f32
// pass ran at 0.34 ns a value with them, 0.23 without, AVX2 on Zen 3).
inline uint32_t bf16_upper(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? (u | 0x00400000u) & 0xffff0000u : rounded;
}
inline uint16_t bf16_bits(float x) { return static_cast<uint16_t>(bf16_upper(x) >> 16); }

// f16, as loom/core/dtype.h's f32_to_f16 and f16_to_f32 but with selects in place of branches
// (plain C++: not every compiler Loom builds with has _Float16). A value below f16's
// smallest normal, 2^-14, is rounded to a multiple of 2^-24 by adding 0.5, whose f32 ulp
// is 2^-24; the sum's low bits are then the f16 bits (1024 when it rounds up to 2^-14, the
// smallest normal's bits).
inline uint16_t f16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // rebias 127 -> 15, round
  const uint32_t small = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  const uint32_t h = a > 0x7f800000u ? 0x7e00u : a >= 0x477ff000u ? 0x7c00u : a < 0x38800000u ? small : normal;
  return static_cast<uint16_t>(sign | h);
}

// A bf16 value's f32 (exact): its bits are the upper half.
inline float bf16_value(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Exact: a normal's exponent rebiased (15 -> 127), infinity and NaN kept, a subnormal's
// mantissa times 2^-24, as (0.5 + m 2^-24) - 0.5 (0.5's ulp is 2^-24, as above). Each case
// is computed and one selected, so the loops vectorize.
inline float f16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(0x3f000000u | m) - 0.5f);
  const uint32_t normal = ((e + 112u) << 23) | (m << 13), special = 0x7f800000u | (m << 13);
  uint32_t bits = normal;
  bits = e == 31 ? special : bits;
  bits = e == 0 ? sub : bits;
  return std::bit_cast<float>(sign | bits);
}

// f32 x with its subnormals flushed to zero (keeping the sign): what an x86 core does to a
// value it reads under DAZ, or writes under FTZ.
inline float flush_subnormal(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return (u & 0x7f800000u) == 0 ? std::bit_cast<float>(u & 0x80000000u) : x;
}

// The bf16 bits a 16-bit product multiplies for f32 x (docs/numerics.md, "16-bit
// products"): x's bf16 rounding, as bf16_bits, but a subnormal x is read as zero, as
// vcvtneps2bf16 and vdpbf16ps read it.
inline uint16_t bf16_operand_bits(float x) { return bf16_bits(flush_subnormal(x)); }
// The same value as an f32 (exact).
inline float bf16_operand(float x) { return std::bit_cast<float>(bf16_upper(flush_subnormal(x))); }
// bf16_operand of the value bf16 bits h hold, from the bits (the packers of 16-bit
// activations): h itself, but a subnormal read as zero (its sign kept) and a NaN made quiet;
// rounding a bf16 value changes nothing, so this is bf16_operand(bf16_value(h)) for every h.
// bf16_operand_bits_of_bits gives those bits, in 16-bit lanes.
inline uint16_t bf16_operand_bits_of_bits(uint16_t h) {
  const uint16_t flushed = (h & 0x7f80u) == 0 ? static_cast<uint16_t>(h & 0x8000u) : h;
  return (h & 0x7fffu) > 0x7f80u ? static_cast<uint16_t>(h | 0x40u) : flushed;
}
inline float bf16_operand_of_bits(uint16_t h) { return bf16_value(bf16_operand_bits_of_bits(h)); }
// What an f16 product multiplies: x rounded to f16 (subnormals of f16 kept), as an f32.
inline float f16_operand(float x) { return f16_value(f16_bits(x)); }
// f16_operand of the value f16 bits h hold, from the bits: h's value, but a NaN made the
// quiet NaN f16_bits gives every NaN (sign kept); rounding an f16 value changes nothing
// else, so this is f16_operand(f16_value(h)) for every h, in one conversion where that is three.
inline float f16_operand_of_bits(uint16_t h) {
  const auto nan = static_cast<uint16_t>((h & 0x8000u) | 0x7e00u);
  return f16_value((h & 0x7fffu) > 0x7c00u ? nan : h);
}

// out[i] = x[i] rounded as round_to rounds it (kF32: copied, nothing done in place), on the
// calling thread: round_copy's body, and an epilogue's tile. out may be x.
inline void round_serial(DType format, float* out, const float* x, int64_t n) {
  if (format == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(bf16_upper(x[i]));
  else if (format == DType::kF16)
    for (int64_t i = 0; i < n; ++i) out[i] = f16_value(f16_bits(x[i]));
  else if (out != x)
    for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}

// y[i] = round(round(y[i]) + r[i]), rounded as round_serial rounds (kF32: y[i] + r[i]), in one
// pass on the calling thread: round_serial, the add, round_serial again (a residual added to
// a rounded output, as add_round adds it) without two passes over y.
inline void round_add_round_serial(DType format, float* y, const float* r, int64_t n) {
  const auto bf16 = [](float x) { return std::bit_cast<float>(bf16_upper(x)); };
  const auto f16 = [](float x) { return f16_value(f16_bits(x)); };
  if (format == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16(bf16(y[i]) + r[i]);
  else if (format == DType::kF16)
    for (int64_t i = 0; i < n; ++i) y[i] = f16(f16(y[i]) + r[i]);
  else
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + r[i];
}

// out[i] = the f32 value of 16-bit in[i] (exact), on the calling thread: load_half's body.
inline void load_half_serial(DType format, float* out, const uint16_t* in, int64_t n) {
  if (format == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_value(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_value(in[i]);
}

// out[i] = x[i] in the 16-bit format's bits (kBF16 or kF16), on the calling thread:
// store_half's body, and an epilogue's tile.
inline void store_half_serial(DType format, uint16_t* out, const float* x, int64_t n) {
  if (format == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(x[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_bits(x[i]);
}

// x[i] = the bf16 or f16 value nearest x[i] (format kBF16 or kF16), in place; kF32 leaves x.
void round_to(DType format, float* x, int64_t n);
// out[i] = x[i] rounded as round_to rounds, in one pass (kF32: copied). out may be x.
void round_copy(DType format, float* out, const float* x, int64_t n);
// out[i] = x[i] in the 16-bit format's bits (rounded as round_to rounds).
void store_half(DType format, uint16_t* out, const float* x, int64_t n);
// out[i] = the f32 value of 16-bit in[i]: exact.
void load_half(DType format, float* out, const uint16_t* in, int64_t n);

}  // namespace loom::kernels
