// LOOM_DISPATCH_FLOAT: runs a statement with T bound to the C++ type of a floating-point
// DType (f32 or f64). Thread-safety: a macro over a switch; no state.
#pragma once

#include "loom/core/dtype.h"
#include "loom/core/error.h"

#define LOOM_DISPATCH_FLOAT(dtype, T, ...)              \
  do {                                                  \
    switch (dtype) {                                    \
      case ::loom::DType::kF32: {                       \
        using T = float;                                \
        __VA_ARGS__;                                    \
        break;                                          \
      }                                                 \
      case ::loom::DType::kF64: {                       \
        using T = double;                               \
        __VA_ARGS__;                                    \
        break;                                          \
      }                                                 \
      default:                                          \
        LOOM_CHECK(false && "expected f32 or f64");  \
    }                                                   \
  } while (0)
