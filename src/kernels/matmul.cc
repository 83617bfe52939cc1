#include "kernels/matmul.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/pointwise.h"
#include "kernels/precision.h"
#include "loom/core/error.h"

namespace loom::kernels {

namespace {

// A forward product's hooks on each block of out: with a bias, the prologue's row, from which
// each output's chain of multiply-adds starts (the kernels load it as they would load C:
// filling out in a pass of its own was 3% of a bf16 gpt-mini step, filling each block just
// before the kernels read it 1%); the epilogue rounds the finished block to round_out, then
// writes gelu(out) rounded likewise (or, with gelu_bits, into 16-bit storage: round_out's
// bits), and with out_bits out's bits too; or adds the residual's rows to it and rounds the
// sum (a pass over out after, and its memory traffic, saved). Either hook may be none.
template <typename T>
struct ForwardHooks {
  GemmPrologue<T> prologue;
  GemmEpilogue<T> epilogue;
};

template <typename T>
ForwardHooks<T> forward_hooks(const T* bias, int64_t m, T* gelu_out, DType round_out, uint16_t* gelu_bits = nullptr,
                              uint16_t* out_bits = nullptr, bool out_scratch = false, const T* residual = nullptr) {
  LOOM_CHECK(residual == nullptr || (gelu_out == nullptr && gelu_bits == nullptr && out_bits == nullptr && !out_scratch));
  LOOM_CHECK(!out_scratch || (gelu_out == nullptr && (out_bits != nullptr || gelu_bits != nullptr)));
  ForwardHooks<T> hooks;
  if (bias != nullptr) hooks.prologue = GemmPrologue<T>(bias);
  if (gelu_out == nullptr && gelu_bits == nullptr && out_bits == nullptr && round_out == DType::kF32 &&
      residual == nullptr)
    return hooks;
  const auto epilogue = [=](int64_t i0, int64_t rows, int64_t j0, int64_t cols, T* block, int64_t ld) {
    for (int64_t i = i0; i < i0 + rows; ++i) {
      T* y = block + (i - i0) * ld;
      T* g = gelu_out == nullptr ? nullptr : gelu_out + i * m + j0;
      if (residual != nullptr) {  // round(round(y) + r), as add_round over the rounded out after
        const T* r = residual + i * m + j0;
        if constexpr (std::is_same_v<T, float>) {
          round_add_round_serial(round_out, y, r, cols);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) y[j] = y[j] + r[j];
        }
        continue;
      }
      if constexpr (std::is_same_v<T, float>) {
        if (out_scratch && out_bits != nullptr) {  // only the bits leave: store_half rounds as it writes
          uint16_t* bits = out_bits + i * m + j0;
          store_half_serial(round_out, bits, y, cols);
          // and the GELU of the values they hold looked up by them (c_fc's): rounding y in
          // place first, then reading it back, was a sixth of this epilogue on a Zen 5 core
          if (gelu_bits != nullptr) gelu_forward_half_of_bits(round_out, gelu_bits + i * m + j0, bits, cols);
          continue;
        }
        round_serial(round_out, y, y, cols);
        if (out_bits != nullptr) store_half_serial(round_out, out_bits + i * m + j0, y, cols);
        if (gelu_bits != nullptr) {
          gelu_forward_half_bits(round_out, gelu_bits + i * m + j0, y, cols);
          continue;
        }
        if (g != nullptr && round_out != DType::kF32) {
          gelu_forward_half(round_out, g, y, cols);
          continue;
        }
      }
      if (g != nullptr) gelu_forward_serial(g, y, cols);
    }
  };
  hooks.epilogue = GemmEpilogue<T>(epilogue, out_scratch);
  return hooks;
}

// dbias (M) += the column sums of value(i, c), i < n, c < m, each column summed over the
// rows in order (column_ranges: 64-column strips read 128-256 bytes of each row, rows
// kilobytes apart, 1.2% of a bf16 gpt-mini step), deterministic whatever the thread count.
template <typename T, typename Value>
void add_column_sums(T* dbias, int64_t n, int64_t m, Value value) {
  column_ranges(n, m, [&](int64_t c0, int64_t c1) {
    thread_local std::vector<T> acc;
    acc.assign(static_cast<size_t>(c1 - c0), T(0));
    T* a = acc.data();
    for (int64_t i = 0; i < n; ++i) {
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) a[c - c0] += value(i, c);
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += a[c - c0];
  });
}

// Mixed precision's dinp rounded to `round` (kF32: none) on each finished block.
GemmEpilogue<float> rounding(DType round) {
  if (round == DType::kF32) return {};
  return [=](int64_t, int64_t rows, int64_t, int64_t cols, float* block, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) round_serial(round, block + r * ld, block + r * ld, cols);
  };
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t k,
                    int64_t m, WeightLayout layout, T* gelu_out, DType operands, DType round_out, const T* residual) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>));
  const ForwardHooks<T> hooks = forward_hooks(bias, m, gelu_out, round_out, nullptr, nullptr, false, residual);
  if (layout == WeightLayout::kKM)
    gemm_as<T>(operands, false, false, n, m, k, inp, k, weight, m, false, out, m, hooks.epilogue, hooks.prologue);
  else
    gemm_as<T>(operands, false, true, n, m, k, inp, k, weight, k, false, out, m, hooks.epilogue, hooks.prologue);
}

void matmul_forward_half(float* out, uint16_t* out_bits, uint16_t* gelu_bits, const float* inp,
                         const uint16_t* inp_bits, const float* weight, const float* bias, int64_t n, int64_t k,
                         int64_t m, DType format, bool out_scratch, const float* residual) {
  LOOM_CHECK((format == DType::kBF16 || format == DType::kF16) && (inp == nullptr) != (inp_bits == nullptr));
  const ForwardHooks<float> hooks =
      forward_hooks(bias, m, static_cast<float*>(nullptr), format, gelu_bits, out_bits, out_scratch, residual);
  if (inp_bits != nullptr)
    gemm_half_bits(format, false, false, n, m, k, inp_bits, k, weight, m, false, out, m, hooks.epilogue,
                   hooks.prologue);
  else
    gemm_half(format, false, false, n, m, k, inp, k, weight, m, false, out, m, hooks.epilogue, hooks.prologue);
}

void matmul_forward_panels(float* out, const float* inp, const PanelMatrix& weight, const float* bias, int64_t n,
                           float* gelu_out) {
  const ForwardHooks<float> hooks = forward_hooks(bias, weight.n, gelu_out, DType::kF32);
  if (hooks.prologue)  // the panels' product has no prologue: the bias first, in a pass of its own
    parallel_for(n, n * weight.n, [&](int64_t i) { hooks.prologue.fill(1, 0, weight.n, out + i * weight.n, weight.n); });
  gemm_panels(n, inp, weight.k, weight, bias != nullptr, out, weight.n, hooks.epilogue);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t n, int64_t k, int64_t m, WeightLayout layout, DType operands, DType round_dinp) {
  LOOM_CHECK((round_dinp == DType::kF32 || std::is_same_v<T, float>));
  GemmEpilogue<T> round;
  if constexpr (std::is_same_v<T, float>) round = rounding(round_dinp);
  if (layout == WeightLayout::kKM) {
    if (dinp != nullptr) gemm_as<T>(operands, false, true, n, k, m, dout, m, weight, m, false, dinp, k, round);
    if (dweight != nullptr) gemm_as<T>(operands, true, false, k, m, n, inp, k, dout, m, true, dweight, m);
  } else {
    if (dinp != nullptr) gemm_as<T>(operands, false, false, n, k, m, dout, m, weight, k, false, dinp, k, round);
    if (dweight != nullptr) gemm_as<T>(operands, true, false, m, k, n, dout, m, inp, k, true, dweight, k);
  }
  if (dbias != nullptr) add_column_sums(dbias, n, m, [=](int64_t i, int64_t c) { return dout[i * m + c]; });
}

void matmul_backward_gelu_bits(uint16_t* dh_bits, float* dinp, const float* dout, const float* weight,
                               const uint16_t* h_bits, int64_t n, int64_t k, int64_t m, DType format) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  // dinp is scratch: each block is taken where the product leaves it (GemmEpilogue::scratch).
  // The next block's rows of h are asked for as this one's are done: their lines are in
  // memory, rows 2 KiB or more apart, which the hardware prefetchers do not follow.
  const auto gelu = [=](int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* block, int64_t ld) {
    for (int64_t i = i0; i < i0 + rows; ++i) {
      // the block's values rounded to the format as they are read (matmul_backward's dinp rounding)
      gelu_backward_half_bits(format, dh_bits + i * k + j0, h_bits + i * k + j0, block + (i - i0) * ld, cols);
    }
    for (int64_t i = i0 + rows; i < std::min(n, i0 + 2 * rows); ++i)
      for (int64_t j = 0; j < cols; j += 32) __builtin_prefetch(h_bits + i * k + j0 + j);
  };
  gemm_half(format, false, true, n, k, m, dout, m, weight, m, false, dinp, k, GemmEpilogue<float>(gelu, true));
}

void matmul_dinp_bits(float* dinp, const uint16_t* dout, const float* weight, int64_t n, int64_t k, int64_t m,
                      DType format, DType round_dinp) {
  gemm_half_bits(format, false, true, n, k, m, dout, m, weight, m, false, dinp, k, rounding(round_dinp));
}

template <typename Dout>
void matmul_weight_grad_bits(float* dweight, float* dbias, const Dout* dout, const uint16_t* inp, DType format,
                             int64_t n, int64_t k, int64_t m) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  gemm_half_bits(format, true, false, k, m, n, inp, k, dout, m, true, dweight, m);
  if (dbias == nullptr) return;
  if constexpr (std::is_same_v<Dout, float>) {
    add_column_sums(dbias, n, m, [=](int64_t i, int64_t c) { return dout[i * m + c]; });
  } else if (format == DType::kBF16) {
    add_column_sums(dbias, n, m, [=](int64_t i, int64_t c) { return bf16_value(dout[i * m + c]); });
  } else {
    add_column_sums(dbias, n, m, [=](int64_t i, int64_t c) { return f16_value(dout[i * m + c]); });
  }
}

template void matmul_weight_grad_bits<float>(float*, float*, const float*, const uint16_t*, DType, int64_t, int64_t,
                                             int64_t);
template void matmul_weight_grad_bits<uint16_t>(float*, float*, const uint16_t*, const uint16_t*, DType, int64_t,
                                                int64_t, int64_t);
template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, WeightLayout, float*, DType, DType, const float*);
template void matmul_forward<double>(double*, const double*, const double*, const double*,
                                     int64_t, int64_t, int64_t, WeightLayout, double*, DType, DType, const double*);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, WeightLayout, DType, DType);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, WeightLayout, DType, DType);

}  // namespace loom::kernels
