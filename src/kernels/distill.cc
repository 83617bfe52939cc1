#include "kernels/distill.h"

#include <cmath>

#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"

namespace loom::kernels {

template <typename T>
void distill_slice_sums(T* sums, const T* logits, const T* soft, const T* mx, int64_t n, int64_t v, T temp) {
  const T inv_t = T(1) / temp;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    const T* p = soft + i * v;
    const T m = mx[i];
    T s = 0, pz = 0, plogp = 0;
    fixed_sum2(v, s, pz, [&](int64_t j, T& a, T& b) {
      a += fast_exp((row[j] - m) * inv_t);
      b += p[j] * row[j];
    });
    for (int64_t j = 0; j < v; ++j)
      if (p[j] > 0) plogp += p[j] * std::log(p[j]);
    sums[i] = s;
    sums[n + i] = pz;
    sums[2 * n + i] = plogp;
  }
}

template <typename T>
void distill_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* soft, const T* mx, const T* sum,
                            const T* sum_t, T dloss, T alpha, T temp, int64_t n, int64_t v, int64_t v_begin) {
  const T inv_t = T(1) / temp;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    const T* p = soft + i * v;
    T* drow = dlogits + i * v;
    const T m = mx[i], hard = dloss * (T(1) - alpha) / sum[i], kd = dloss * alpha * temp, inv_st = T(1) / sum_t[i];
    for (int64_t j = 0; j < v; ++j) {
      const T z = row[j];
      drow[j] = fast_exp(z - m) * hard + kd * (fast_exp((z - m) * inv_t) * inv_st - p[j]);
    }
    const int64_t target = targets[i] - v_begin;
    if (target >= 0 && target < v) drow[target] -= dloss * (T(1) - alpha);
  }
}

template void distill_slice_sums<float>(float*, const float*, const float*, const float*, int64_t, int64_t, float);
template void distill_slice_sums<double>(double*, const double*, const double*, const double*, int64_t, int64_t, double);
template void distill_slice_backward<float>(float*, const float*, const int32_t*, const float*, const float*,
                                            const float*, const float*, float, float, float, int64_t, int64_t, int64_t);
template void distill_slice_backward<double>(double*, const double*, const int32_t*, const double*, const double*,
                                             const double*, const double*, double, double, double, int64_t, int64_t,
                                             int64_t);

}  // namespace loom::kernels
