#include "kernels/cross_entropy.h"

#include <cmath>

#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"

namespace loom::kernels {

// Each row's maximum (the shift of its exponentials) is row_max's (fixed_sum.h): vectorized,
// the same bits on every CPU. Of a largest zero it may keep the other sign than
// std::max_element, which changes no loss or gradient: fast_exp(+0) and fast_exp(-0) are
// both 1, and log(sum) + -0 is log(sum).

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n,
                           int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    const T mx = row_max(row, v);
    const T sum = fixed_sum<T>(v, [&](int64_t j) { return fast_exp(row[j] - mx); });
    losses[i] = std::log(sum) + mx - row[targets[i]];
  }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T dloss,
                            int64_t n, int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    T* drow = dlogits + i * v;
    const T mx = row_max(row, v);
    const T sum = fixed_sum<T>(v, [&](int64_t j) { return drow[j] = fast_exp(row[j] - mx); });
    T inv = dloss / sum;
    for (int64_t j = 0; j < v; ++j) drow[j] *= inv;
    drow[targets[i]] -= dloss;
  }
}

template <typename T>
void cross_entropy_slice_max(T* mx, const T* logits, int64_t n, int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) mx[i] = row_max(logits + i * v, v);
}

template <typename T>
void cross_entropy_slice_sums(T* sums, const T* logits, const int32_t* targets, const T* mx, int64_t n, int64_t v,
                              int64_t v_begin) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    const T m = mx[i];
    sums[i] = fixed_sum<T>(v, [&](int64_t j) { return fast_exp(row[j] - m); });
    const int64_t target = targets[i] - v_begin;
    sums[n + i] = target >= 0 && target < v ? row[target] : T(0);
  }
}

template <typename T>
void cross_entropy_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* mx, const T* sum,
                                  T dloss, int64_t n, int64_t v, int64_t v_begin) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    T* drow = dlogits + i * v;
    const T m = mx[i], inv = dloss / sum[i];
    for (int64_t j = 0; j < v; ++j) drow[j] = fast_exp(row[j] - m) * inv;
    const int64_t target = targets[i] - v_begin;
    if (target >= 0 && target < v) drow[target] -= dloss;
  }
}

#define LOOM_CROSS_ENTROPY_SLICE(T)                                                                                \
  template void cross_entropy_slice_max<T>(T*, const T*, int64_t, int64_t);                                        \
  template void cross_entropy_slice_sums<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t);    \
  template void cross_entropy_slice_backward<T>(T*, const T*, const int32_t*, const T*, const T*, T, int64_t, int64_t, \
                                                int64_t);
LOOM_CROSS_ENTROPY_SLICE(float)
LOOM_CROSS_ENTROPY_SLICE(double)
#undef LOOM_CROSS_ENTROPY_SLICE

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int64_t,
                                           int64_t);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int64_t,
                                            int64_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, float, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, double,
                                             int64_t, int64_t);

}  // namespace loom::kernels
