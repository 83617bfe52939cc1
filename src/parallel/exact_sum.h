// Exact, order-independent sums of f32 values (docs/parallelism.md, "Deterministic mode").
//
// A float x becomes the integer round(x * 2^64), held as three 32-bit limbs in int64
// slots (low and middle limbs unsigned, the top one signed). Adding limbs is integer
// addition, which is associative, so any grouping of the same terms (micro-steps on one
// rank, ranks in any all-reduce tree) gives the same bits; decoding rounds to f32 once.
// Each int64 slot has 31 bits of headroom: up to 2^31 terms may be summed.
// Range: |x| < 2^31; resolution 2^-64 (terms below 2^-65 vanish, identically everywhere).
#pragma once

#include <cstdint>

namespace loom::parallel {

constexpr int kLimbs = 3;  // int64 slots per element

// acc[3i .. 3i+2] += limbs(x[i]) for every i < n whose x[i] is in range. Returns the
// first i whose value is not (NaN, Inf or |x| >= 2^31: its sum is left as it was), or -1
// when every one is: the caller stops the step (DataParallel reports the norm as NaN).
int64_t exact_accumulate(const float* x, int64_t* acc, int64_t n);
// out[i] = the f32 nearest to the sum held in acc[3i .. 3i+2].
void exact_decode(const int64_t* acc, float* out, int64_t n);

// Exact sum of squares for a gradient norm: 5 limbs of 32 bits over a 2^-96 resolution.
constexpr int kSquareLimbs = 5;
// acc[0..4] += sum of x[i]^2 (each square exact in double, then fixed point).
void exact_accumulate_squares(const float* x, int64_t n, int64_t* acc);
// The double nearest (deterministically) to the integer in acc[0..4], times 2^-96.
double exact_decode_squares(const int64_t* acc);

}  // namespace loom::parallel
