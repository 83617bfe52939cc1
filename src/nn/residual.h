// The residual stream's a += b, elementwise: the blocks' forward and backward and the
// incremental decoder all add this way.
#pragma once

#include "kernels/pointwise.h"
#include "loom/core/tensor.h"
#include "loom/core/dtype_dispatch.h"

namespace loom::nn {

inline void add_into(const Tensor& a, const Tensor& b) {
  LOOM_DISPATCH_FLOAT(a.dtype(), T, kernels::add_forward(a.data<T>(), a.data<T>(), b.data<T>(), a.numel()));
}

// a += b, then a rounded to `format` (mixed precision; kF32: not rounded), in one pass.
inline void add_into(const Tensor& a, const Tensor& b, DType format) {
  if (format == DType::kF32) return add_into(a, b);
  kernels::add_round(a.data<float>(), a.data<float>(), b.data<float>(), a.numel(), format);
}

}  // namespace loom::nn
