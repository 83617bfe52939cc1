// Runs a statement with T bound to the C++ type of a floating-point DType.
#pragma once

#include "loom/dtype.h"
#include "loom/error.h"

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
        LOOM_CHECK(false && "layers compute in f32 or f64"); \
    }                                                   \
  } while (0)
