#include "kernels/matmul.h"

#include <algorithm>
#include <type_traits>

#include "kernels/parallel.h"
#include "kernels/pointwise.h"
#include "kernels/precision.h"
#include "loom/core/error.h"

namespace loom::kernels {

namespace {

// Before a forward product: with a bias, each output's chain of multiply-adds starts from
// it (copied into out); returns the epilogue that works on each tile of out as it is done
// (rounds it to round_out, then writes gelu(out) rounded likewise), or none.
template <typename T>
GemmEpilogue start_forward(T* out, const T* bias, int64_t n, int64_t m, T* gelu_out, DType round_out) {
  if (bias != nullptr) parallel_for(n, n * m, [&](int64_t i) { std::copy(bias, bias + m, out + i * m); });
  if (gelu_out == nullptr && round_out == DType::kF32) return {};
  return [=](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    for (int64_t i = i0; i < i0 + rows; ++i) {
      T* y = out + i * m + j0;
      T* g = gelu_out == nullptr ? nullptr : gelu_out + i * m + j0;
      if constexpr (std::is_same_v<T, float>) round_serial(round_out, y, y, cols);
      if (g == nullptr) continue;
      gelu_forward_serial(g, y, cols);
      if constexpr (std::is_same_v<T, float>) round_serial(round_out, g, g, cols);
    }
  };
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t k,
                    int64_t m, WeightLayout layout, T* gelu_out, DType operands, DType round_out) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>));
  const bool has_bias = bias != nullptr;
  const GemmEpilogue epilogue = start_forward(out, bias, n, m, gelu_out, round_out);
  if (layout == WeightLayout::kKM)
    gemm_as<T>(operands, false, false, n, m, k, inp, k, weight, m, has_bias, out, m, epilogue);
  else
    gemm_as<T>(operands, false, true, n, m, k, inp, k, weight, k, has_bias, out, m, epilogue);
}

void matmul_forward_panels(float* out, const float* inp, const PanelMatrix& weight, const float* bias, int64_t n,
                           float* gelu_out) {
  const GemmEpilogue epilogue = start_forward(out, bias, n, weight.n, gelu_out, DType::kF32);
  gemm_panels(n, inp, weight.k, weight, bias != nullptr, out, weight.n, epilogue);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t n, int64_t k, int64_t m, WeightLayout layout, DType operands, DType round_dinp) {
  LOOM_CHECK((round_dinp == DType::kF32 || std::is_same_v<T, float>));
  GemmEpilogue round;
  if constexpr (std::is_same_v<T, float>)
    if (round_dinp != DType::kF32)
      round = [=](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
        for (int64_t i = i0; i < i0 + rows; ++i) round_serial(round_dinp, dinp + i * k + j0, dinp + i * k + j0, cols);
      };
  if (layout == WeightLayout::kKM) {
    if (dinp != nullptr) gemm_as<T>(operands, false, true, n, k, m, dout, m, weight, m, false, dinp, k, round);
    if (dweight != nullptr) gemm_as<T>(operands, true, false, k, m, n, inp, k, dout, m, true, dweight, m);
  } else {
    if (dinp != nullptr) gemm_as<T>(operands, false, false, n, k, m, dout, m, weight, k, false, dinp, k, round);
    if (dweight != nullptr) gemm_as<T>(operands, true, false, m, k, n, dout, m, inp, k, true, dweight, k);
  }
  if (dbias != nullptr) {
    // Columns split across threads; each column summed over rows in order: deterministic
    // whatever the thread count.
    constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < m; c0 += kCols) {
      int64_t c1 = std::min(m, c0 + kCols);
      T acc[kCols] = {};
      for (int64_t i = 0; i < n; ++i) {
        const T* row = dout + i * m;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

void matmul_weight_grad_bits(float* dweight, const float* dout, const uint16_t* inp, DType format, int64_t n,
                             int64_t k, int64_t m) {
  gemm_half_bits_a(format, true, false, k, m, n, inp, k, dout, m, true, dweight, m);
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, WeightLayout, float*, DType, DType);
template void matmul_forward<double>(double*, const double*, const double*, const double*,
                                     int64_t, int64_t, int64_t, WeightLayout, double*, DType, DType);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, WeightLayout, DType, DType);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, WeightLayout, DType, DType);

}  // namespace loom::kernels
