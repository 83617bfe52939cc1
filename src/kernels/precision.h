// Mixed precision (docs/numerics.md, "Mixed precision"): rounding f32 values to the values
// bf16 or f16 can hold, and moving them to and from 16-bit storage. Every conversion rounds
// to nearest, ties to even, as loom/core/dtype.h's scalar ones (the reference twins): NaN stays
// NaN, f16 overflows to infinity, f16's subnormals are kept.
// Thread-safety: reentrant; large arrays use the OpenMP pool (kernels/parallel.h).
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

// x[i] = the bf16 or f16 value nearest x[i] (format kBF16 or kF16), in place; kF32 leaves x.
void round_to(DType format, float* x, int64_t n);
// out[i] = x[i] rounded as round_to rounds, in one pass (kF32: copied). out may be x.
void round_copy(DType format, float* out, const float* x, int64_t n);
// out[i] = x[i] in the 16-bit format's bits (rounded as round_to rounds).
void store_half(DType format, uint16_t* out, const float* x, int64_t n);
// out[i] = the f32 value of 16-bit in[i]: exact.
void load_half(DType format, float* out, const uint16_t* in, int64_t n);

}  // namespace loom::kernels
