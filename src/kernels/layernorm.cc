#include "kernels/layernorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/fixed_sum.h"
#include "kernels/parallel.h"

namespace loom::kernels {

namespace {

// One row: y = (x - mean) * rstd * weight + bias.
template <typename T>
inline void layernorm_row(T* y, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t c) {
  const T m = fixed_sum<T>(c, [&](int64_t j) { return x[j]; }) / static_cast<T>(c);
  const T var = fixed_sum<T>(c, [&](int64_t j) { return (x[j] - m) * (x[j] - m); });
  T s = T(1) / std::sqrt(var / static_cast<T>(c) + static_cast<T>(kLayerNormEps));
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - m) * s * weight[j] + bias[j];
  *mean = m;
  *rstd = s;
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t n, int64_t c) {
  parallel_for(n, n * c,
               [&](int64_t i) { layernorm_row(out + i * c, mean + i, rstd + i, inp + i * c, weight, bias, c); });
}

template <typename T>
void add_layernorm_forward(T* x, const T* residual, T* out, T* mean, T* rstd, const T* weight, const T* bias,
                           int64_t n, int64_t c) {
  parallel_for(n, n * c, [&](int64_t i) {
    T* row = x + i * c;
    const T* r = residual + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) row[j] = row[j] + r[j];  // as add_forward(x, x, residual)
    layernorm_row(out + i * c, mean + i, rstd + i, row, weight, bias, c);
  });
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t n, int64_t c) {
  // dinp: rows are independent.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = inp + i * c;
    const T* dy = dout + i * c;
    T m = mean[i], s = rstd[i];
    T sum_g = 0, sum_gx = 0;  // mean of (dy * w) and of (dy * w * xhat)
    fixed_sum2(c, sum_g, sum_gx, [&](int64_t j, T& a, T& b) {
      const T g = dy[j] * weight[j];
      a += g;
      b += g * (x[j] - m) * s;
    });
    sum_g /= static_cast<T>(c);
    sum_gx /= static_cast<T>(c);
    T* dx = dinp + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      T xhat = (x[j] - m) * s;
      dx[j] = (dy[j] * weight[j] - sum_g - xhat * sum_gx) * s;
    }
  }
  // dweight, dbias: columns split across threads, rows summed in order (deterministic).
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < c; c0 += kCols) {
    int64_t c1 = std::min(c, c0 + kCols);
    T dw[kCols] = {}, db[kCols] = {};
    for (int64_t i = 0; i < n; ++i) {
      const T* x = inp + i * c;
      const T* dy = dout + i * c;
      T m = mean[i], s = rstd[i];
      for (int64_t j = c0; j < c1; ++j) {
        dw[j - c0] += dy[j] * (x[j] - m) * s;
        db[j - c0] += dy[j];
      }
    }
    for (int64_t j = c0; j < c1; ++j) {
      dweight[j] += dw[j - c0];
      dbias[j] += db[j - c0];
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int64_t, int64_t);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, int64_t, int64_t);
template void add_layernorm_forward<float>(float*, const float*, float*, float*, float*, const float*, const float*,
                                           int64_t, int64_t);
template void add_layernorm_forward<double>(double*, const double*, double*, double*, double*, const double*,
                                            const double*, int64_t, int64_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int64_t,
                                        int64_t);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int64_t,
                                         int64_t);

}  // namespace loom::kernels
