#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"

namespace loom::kernels {
namespace {

// The largest of row[0 .. v), *std::max_element's value, in kSumLanes running maxima the
// compiler vectorizes (max_element tracks an index, which kept its loop scalar: 78% of
// cross_entropy_forward's time on Zen 3 at vocab 4096). Lane l takes elements j with
// j % 16 == l and the lanes fold pairwise, as fixed_sum's do, so the bits are the same on
// every CPU. The value is max_element's (a maximum does not depend on the order it is taken
// in), NaNs aside, and but for the sign of a largest zero, which changes no loss or gradient:
// fast_exp(+0) and fast_exp(-0) are both 1, and log(sum) + -0 is log(sum).
template <typename T>
T row_max(const T* row, int64_t v) {
  if (v < kSumLanes) return *std::max_element(row, row + v);
  T acc[kSumLanes];
  for (int l = 0; l < kSumLanes; ++l) acc[l] = row[l];
  int64_t j = kSumLanes;
  for (; j + kSumLanes <= v; j += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) acc[l] = acc[l] < row[j + l] ? row[j + l] : acc[l];
  }
  for (int l = 0; j + l < v; ++l) acc[l] = acc[l] < row[j + l] ? row[j + l] : acc[l];
  for (int w = kSumLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l] < acc[l + w] ? acc[l + w] : acc[l];
  return acc[0];
}

}  // namespace

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
