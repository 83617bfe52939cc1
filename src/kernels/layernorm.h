// LayerNorm over the last dimension. Legend: N rows, C channels.
#pragma once

#include <cstdint>

namespace loom::kernels {

constexpr double kLayerNormEps = 1e-5;  // as PyTorch's and GPT-2's default

// out (N, C) = (inp - mean) * rstd * weight + bias; saves mean (N) and rstd (N).
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t n, int64_t c);
// The residual add and the LayerNorm after it in one pass over the rows: x (N, C) += residual
// (in place), then out, mean, rstd as layernorm_forward of x. The same bits as add_forward
// then layernorm_forward (one row function for both).
template <typename T>
void add_layernorm_forward(T* x, const T* residual, T* out, T* mean, T* rstd, const T* weight, const T* bias,
                           int64_t n, int64_t c);
// dinp (N, C) overwritten; dweight (C), dbias (C) accumulated (+=). Deterministic.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t n, int64_t c);

}  // namespace loom::kernels
