// Pointwise kernels: GELU (tanh form, as GPT-2) and the residual add.
// Fast versions: OpenMP-parallel, vectorizable loops.
#pragma once

#include <cstdint>

namespace loom::kernels {

// out = gelu(inp) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
// The same on the calling thread only (inside a parallel region: a GEMM epilogue). Each
// element is computed as gelu_forward computes it: the same bits.
template <typename T>
void gelu_forward_serial(T* out, const T* inp, int64_t n);
// dinp = gelu'(inp) * dout (overwritten).
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// out = a + b, n elements; out may alias a or b.
template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n);

}  // namespace loom::kernels
