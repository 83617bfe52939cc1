#include "kernels/layernorm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/fixed_sum.h"
#include "kernels/parallel.h"
#include "kernels/precision.h"
#include "loom/core/error.h"

namespace loom::kernels {

namespace {

// One row's mean and rstd.
template <typename T>
inline void row_statistics(T* mean, T* rstd, const T* x, int64_t c) {
  const T m = fixed_sum<T>(c, [&](int64_t j) { return x[j]; }) / static_cast<T>(c);
  const T var = fixed_sum<T>(c, [&](int64_t j) { return (x[j] - m) * (x[j] - m); });
  *mean = m;
  *rstd = T(1) / std::sqrt(var / static_cast<T>(c) + static_cast<T>(kLayerNormEps));
}

// One row: y = (x - mean) * rstd * weight + bias.
template <typename T>
inline void layernorm_row(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t c) {
  row_statistics(mean, rstd, x, c);
  const T m = *mean, s = *rstd;
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - m) * s * weight[j] + bias[j];
}

// A 16-bit format's rounding of an f32, with the rounded value's bits (round_serial's and
// store_half_serial's), and the bits of an f32 rounded.
struct ToBf16 {
  static float round(float x, uint16_t& bits) {
    const uint32_t u = bf16_upper(x);
    bits = static_cast<uint16_t>(u >> 16);
    return std::bit_cast<float>(u);
  }
  static uint16_t bits(float x) { return bf16_bits(x); }
};
struct ToF16 {
  static float round(float x, uint16_t& bits) {
    bits = f16_bits(x);
    return f16_value(bits);
  }
  static uint16_t bits(float x) { return f16_bits(x); }
};

// Mixed precision's rows, whose output leaves only as bits: row i of x normalized straight
// into out_bits; with a residual, first x's row plus the residual's, rounded, written to sum
// (which may be x; its bits to sum_bits where given) and normalized. The bits of the f32
// rows (add, round_row, store_half_serial, layernorm_row into a row of the thread's,
// store_half_serial), in passes that vectorize with no row between: one Zen 5 core, 2048 x
// 256 with the residual, 0.25 ms where those took 0.56.
template <typename To>
void half_rows(const float* x, const float* residual, float* sum, uint16_t* sum_bits, uint16_t* out_bits, float* mean,
               float* rstd, const float* weight, const float* bias, int64_t n, int64_t c) {
  parallel_for(n, n * c, [&](int64_t i) {
    const float* row = x + i * c;
    if (residual != nullptr) {
      const float* r = residual + i * c;
      float* to = sum + i * c;
      if (sum_bits != nullptr) {
        uint16_t* bits = sum_bits + i * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) to[j] = To::round(row[j] + r[j], bits[j]);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          uint16_t unused;
          to[j] = To::round(row[j] + r[j], unused);
        }
      }
      row = to;
    }
    row_statistics(mean + i, rstd + i, row, c);
    const float m = mean[i], s = rstd[i];
    uint16_t* y = out_bits + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) y[j] = To::bits((row[j] - m) * s * weight[j] + bias[j]);
  });
}

// half_rows in `format` (kBF16 or kF16); T float only (a 16-bit output is mixed precision's).
template <typename T>
void half_rows_in(DType format, const T* x, const T* residual, T* sum, uint16_t* sum_bits, uint16_t* out_bits, T* mean,
                  T* rstd, const T* weight, const T* bias, int64_t n, int64_t c) {
  if constexpr (std::is_same_v<T, float>) {
    if (format == DType::kBF16)
      half_rows<ToBf16>(x, residual, sum, sum_bits, out_bits, mean, rstd, weight, bias, n, c);
    else
      half_rows<ToF16>(x, residual, sum, sum_bits, out_bits, mean, rstd, weight, bias, n, c);
  }
}

// A row rounded to `format` in place (mixed precision's values; kF32 or T double: kept).
template <typename T>
void round_row(DType format, T* x, int64_t c) {
  if constexpr (std::is_same_v<T, float>) round_serial(format, x, x, c);
}

// Row i's output into out, rounded to round_out.
template <typename T>
void output_row(T* out, int64_t i, int64_t c, DType round_out, const auto& row_into) {
  row_into(out + i * c);
  round_row(round_out, out + i * c, c);
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t n, int64_t c,
                       DType round_out, uint16_t* out_bits) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>) && (out_bits == nullptr) != (out == nullptr) &&
             (out_bits == nullptr || round_out != DType::kF32));
  if (out_bits != nullptr)
    return half_rows_in<T>(round_out, inp, nullptr, nullptr, nullptr, out_bits, mean, rstd, weight, bias, n, c);
  parallel_for(n, n * c, [&](int64_t i) {
    output_row(out, i, c, round_out,
               [&](T* y) { layernorm_row(y, mean + i, rstd + i, inp + i * c, weight, bias, c); });
  });
}

template <typename T>
void add_layernorm_forward(T* x, const T* residual, T* out, T* mean, T* rstd, const T* weight, const T* bias,
                           int64_t n, int64_t c, DType round_out, uint16_t* out_bits, uint16_t* x_bits) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>) && (out_bits == nullptr) != (out == nullptr) &&
             ((out_bits == nullptr && x_bits == nullptr) || round_out != DType::kF32));
  if (out_bits != nullptr)
    return half_rows_in<T>(round_out, x, residual, x, x_bits, out_bits, mean, rstd, weight, bias, n, c);
  parallel_for(n, n * c, [&](int64_t i) {
    T* row = x + i * c;
    const T* r = residual + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) row[j] = row[j] + r[j];  // as add_forward(x, x, residual)
    round_row(round_out, row, c);                             // as add_round: the sum is normalized rounded
    if constexpr (std::is_same_v<T, float>)
      if (x_bits != nullptr) store_half_serial(round_out, x_bits + i * c, row, c);
    output_row(out, i, c, round_out, [&](T* y) { layernorm_row(y, mean + i, rstd + i, row, weight, bias, c); });
  });
}

namespace {

// What the backward reads x as: its values, or a 16-bit format's bits as the f32 values they
// hold (exact: the bits of the backward over load_half's values).
struct AsStored {
  template <typename T>
  T operator()(T x) const {
    return x;
  }
};
struct Bf16Bits {
  float operator()(uint16_t x) const { return bf16_value(x); }
};
struct F16Bits {
  float operator()(uint16_t x) const { return f16_value(x); }
};

template <typename T, typename X, typename Value>
void backward_rows(T* dinp, T* dweight, T* dbias, const T* dout, const X* inp, Value value, const T* weight,
                   const T* mean, const T* rstd, int64_t n, int64_t c, DType round_out, const T* residual) {
  // dinp: rows are independent; each row rounded to round_out as it is written (and the
  // residual's row added, the sum rounded, as add_round would after).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const X* x = inp + i * c;
    const T* dy = dout + i * c;
    T m = mean[i], s = rstd[i];
    T sum_g = 0, sum_gx = 0;  // mean of (dy * w) and of (dy * w * xhat)
    fixed_sum2(c, sum_g, sum_gx, [&](int64_t j, T& a, T& b) {
      const T g = dy[j] * weight[j];
      a += g;
      b += g * (value(x[j]) - m) * s;
    });
    sum_g /= static_cast<T>(c);
    sum_gx /= static_cast<T>(c);
    T* dx = dinp + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      T xhat = (value(x[j]) - m) * s;
      dx[j] = (dy[j] * weight[j] - sum_g - xhat * sum_gx) * s;
    }
    if (residual == nullptr) {
      round_row(round_out, dx, c);
    } else if constexpr (std::is_same_v<T, float>) {
      round_add_round_serial(round_out, dx, residual + i * c, c);
    } else {
      const T* r = residual + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dx[j] = dx[j] + r[j];
    }
  }
  // dweight, dbias: each column summed over the rows in order, each thread's range of
  // columns read row after row (column_ranges).
  column_ranges(n, c, [&](int64_t c0, int64_t c1) {
    thread_local std::vector<T> acc;
    acc.assign(static_cast<size_t>(2 * (c1 - c0)), T(0));
    T* dw = acc.data();
    T* db = dw + (c1 - c0);
    for (int64_t i = 0; i < n; ++i) {
      const X* x = inp + i * c + c0;
      const T* dy = dout + i * c + c0;
      const T m = mean[i], s = rstd[i];
#pragma omp simd
      for (int64_t j = 0; j < c1 - c0; ++j) {
        dw[j] += dy[j] * (value(x[j]) - m) * s;
        db[j] += dy[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      dweight[j] += dw[j - c0];
      dbias[j] += db[j - c0];
    }
  });
}

}  // namespace

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int64_t n, int64_t c, DType round_out, const T* residual) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>));
  backward_rows(dinp, dweight, dbias, dout, inp, AsStored{}, weight, mean, rstd, n, c, round_out, residual);
}

void layernorm_backward_bits(float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                             DType format, const float* weight, const float* mean, const float* rstd, int64_t n,
                             int64_t c, DType round_out, const float* residual) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  if (format == DType::kBF16)
    backward_rows(dinp, dweight, dbias, dout, inp, Bf16Bits{}, weight, mean, rstd, n, c, round_out, residual);
  else
    backward_rows(dinp, dweight, dbias, dout, inp, F16Bits{}, weight, mean, rstd, n, c, round_out, residual);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                       int64_t, DType, uint16_t*);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*,
                                        int64_t, int64_t, DType, uint16_t*);
template void add_layernorm_forward<float>(float*, const float*, float*, float*, float*, const float*, const float*,
                                           int64_t, int64_t, DType, uint16_t*, uint16_t*);
template void add_layernorm_forward<double>(double*, const double*, double*, double*, double*, const double*,
                                            const double*, int64_t, int64_t, DType, uint16_t*, uint16_t*);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int64_t, int64_t, DType, const float*);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int64_t, int64_t, DType, const double*);

}  // namespace loom::kernels
