#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "kernels/fast_math.h"

namespace loom::kernels {

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n,
                           int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * v;
    T mx = *std::max_element(row, row + v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += fast_exp(row[j] - mx);
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
    T mx = *std::max_element(row, row + v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      drow[j] = fast_exp(row[j] - mx);
      sum += drow[j];
    }
    T inv = dloss / sum;
    for (int64_t j = 0; j < v; ++j) drow[j] *= inv;
    drow[targets[i]] -= dloss;
  }
}

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int64_t,
                                           int64_t);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int64_t,
                                            int64_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, float, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, double,
                                             int64_t, int64_t);

}  // namespace loom::kernels
