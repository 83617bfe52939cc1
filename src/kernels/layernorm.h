// LayerNorm over the last dimension. Legend: N rows, C channels.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

constexpr double kLayerNormEps = 1e-5;  // as PyTorch's and GPT-2's default

// out (N, C) = (inp - mean) * rstd * weight + bias, each value rounded to round_out (kBF16 or
// kF16 with T float: mixed precision's activations; kF32: as computed); saves mean (N) and
// rstd (N). With out_bits (and out null; round_out 16-bit) the output is written only as
// those values' 16-bit bits.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t n, int64_t c,
                       DType round_out = DType::kF32, uint16_t* out_bits = nullptr);
// The residual add and the LayerNorm after it in one pass over the rows: x (N, C) += residual
// (in place, rounded to round_out as add_round rounds; with x_bits the sum's 16-bit bits
// written there too), then out (or out_bits), mean, rstd as layernorm_forward of x. The same
// bits as add_round (add_forward for kF32) then layernorm_forward (one row function for both).
template <typename T>
void add_layernorm_forward(T* x, const T* residual, T* out, T* mean, T* rstd, const T* weight, const T* bias,
                           int64_t n, int64_t c, DType round_out = DType::kF32, uint16_t* out_bits = nullptr,
                           uint16_t* x_bits = nullptr);
// dinp (N, C) overwritten, each value rounded to round_out as it is written (kBF16 or kF16
// with T float: mixed precision's gradient; kF32: as computed); dweight (C), dbias (C)
// accumulated (+=). With `residual` (N, C), each row of dinp then has the residual's row
// added and is rounded again while it is in cache (a block's residual gradient: the bits of
// add_round, or add_forward, over dinp after). Deterministic.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int64_t n, int64_t c, DType round_out = DType::kF32,
                        const T* residual = nullptr);
// The same with inp held in 16 bits (`format`'s bits, as mixed precision keeps the input for
// backward): the bits of layernorm_backward on inp's f32 values, without a pass that loads
// them first.
void layernorm_backward_bits(float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                             DType format, const float* weight, const float* mean, const float* rstd, int64_t n,
                             int64_t c, DType round_out, const float* residual = nullptr);

}  // namespace loom::kernels
