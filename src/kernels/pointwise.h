// Pointwise kernels: GELU (tanh form, as GPT-2) and the residual add.
// Fast versions: OpenMP-parallel, vectorizable loops.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

// out = gelu(inp) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
// The same on the calling thread only (inside a parallel region: a GEMM epilogue). Each
// element is computed as gelu_forward computes it: the same bits.
template <typename T>
void gelu_forward_serial(T* out, const T* inp, int64_t n);
// out = inp's GELU rounded to `format` (kBF16 or kF16), on the calling thread, where inp
// holds values of that format (rounded already): the bits of gelu_forward_serial and
// round_to, read from a table of the format's 65,536 values (a GEMM epilogue's GELU).
void gelu_forward_half(DType format, float* out, const float* inp, int64_t n);
// The same results in the format's bits (as store_half writes them).
void gelu_forward_half_bits(DType format, uint16_t* out, const float* inp, int64_t n);
// The same from the input's bits (the format's, as store_half writes them): out[i] is
// gelu_forward_half_bits's for the value inp[i] holds, read from the table by the bits
// themselves (an epilogue that writes its output's bits anyway: no pass rounding the f32
// output first, and f16's bits not made twice).
void gelu_forward_half_of_bits(DType format, uint16_t* out, const uint16_t* inp, int64_t n);
// dinp = gelu'(inp) * dout (overwritten).
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);
// The same with inp held in 16-bit storage (format kBF16 or kF16: its bits), and dinp rounded
// to round_out (kBF16 or kF16; kF32: as computed): the bits of load_half, gelu_backward and
// round_to, in one pass (mixed precision's MLP backward).
void gelu_backward_bits(float* dinp, const uint16_t* inp, DType format, const float* dout, int64_t n,
                        DType round_out);
// The same with round_out `format` and dinp in the format's bits too, on the calling thread
// (a GEMM epilogue's), and dout rounded to `format` as it is read: the bits store_half writes
// of gelu_backward_bits's dinp for dout's rounded values.
void gelu_backward_half_bits(DType format, uint16_t* dinp, const uint16_t* inp, const float* dout, int64_t n);

// out = a + b, n elements; out may alias a or b.
template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n);
// The same, then rounded to `format` (kBF16 or kF16), in one pass: the bits of add_forward
// and round_to after.
void add_round(float* out, const float* a, const float* b, int64_t n, DType format);

}  // namespace loom::kernels
