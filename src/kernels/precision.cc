#include "kernels/precision.h"

#include <bit>

#include "kernels/parallel.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

// bf16: the upper half of the f32 bits, rounded to nearest even; a NaN keeps its sign and
// becomes quiet. Branch-free, so the loops vectorize.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);
}

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

}  // namespace

void round_to(DType format, float* x, int64_t n) {
  if (format != DType::kF32) round_copy(format, x, x, n);
}

void round_copy(DType format, float* out, const float* x, int64_t n) {
  LOOM_CHECK(format == DType::kF32 || format == DType::kBF16 || format == DType::kF16);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
    if (format == DType::kBF16)
      for (int64_t i = lo; i < hi; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(bf16_bits(x[i])) << 16);
    else if (format == DType::kF16)
      for (int64_t i = lo; i < hi; ++i) out[i] = f16_value(f16_bits(x[i]));
    else
      for (int64_t i = lo; i < hi; ++i) out[i] = x[i];
  });
}

void store_half(DType format, uint16_t* out, const float* x, int64_t n) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  if (format == DType::kBF16) {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = bf16_bits(x[i]);
    });
  } else {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = f16_bits(x[i]);
    });
  }
}

void load_half(DType format, float* out, const uint16_t* in, int64_t n) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  if (format == DType::kBF16) {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
    });
  } else {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = f16_value(in[i]);
    });
  }
}

}  // namespace loom::kernels
