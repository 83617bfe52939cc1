// Sums whose order is fixed by the code, not by the vector width the compiler picks. An
// `omp simd reduction` lets the compiler reassociate: 16 partial sums on an AVX-512 build,
// 8 on an AVX2 one, so a softmax or LayerNorm row could differ in its last bit between
// CPUs. Here element j always goes to partial sum j % 16 in order, and the 16 partials
// are added pairwise (l + 8, then + 4, + 2, + 1). No reduction clause is involved, so the
// compiler may vectorize (one zmm or two ymm of partials) but not reorder: the same bits
// on every x86-64 CPU with FMA (docs/numerics.md, "Threads").
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace loom::kernels {

inline constexpr int kSumLanes = 16;

namespace fixed_sum_detail {
// The lanes combined pairwise (l + 8, then + 4, + 2, + 1) by `combine` (a sum by default).
template <typename T, typename Combine = std::plus<T>>
inline T fold(T (&acc)[kSumLanes], Combine combine = {}) {
  for (int w = kSumLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = combine(acc[l], acc[l + w]);
  return acc[0];
}
// The larger of a and b as std::max_element picks (b only when a < b); vectorizes to max.
template <typename T>
inline T larger(T a, T b) {
  return a < b ? b : a;
}
}  // namespace fixed_sum_detail

// sum of f(j) for j in [0, n); f may also write (each j is called once, in order within a lane).
template <typename T, typename F>
inline T fixed_sum(int64_t n, F&& f) {
  T acc[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) acc[l] += f(j + l);
  }
  for (int l = 0; j + l < n; ++l) acc[l] += f(j + l);
  return fixed_sum_detail::fold(acc);
}

// The largest of row[0 .. n), *std::max_element's value, in the same lanes and fold (lane l
// takes elements j % 16 == l), which the compiler vectorizes where max_element, tracking an
// index, stays scalar (78% of the cross-entropy's forward time on Zen 3 at vocab 4096). The
// value is max_element's, NaNs aside, and but for the sign of a largest zero.
template <typename T>
inline T fixed_max(const T* row, int64_t n) {
  if (n < kSumLanes) return *std::max_element(row, row + n);
  T acc[kSumLanes];
  for (int l = 0; l < kSumLanes; ++l) acc[l] = row[l];
  int64_t j = kSumLanes;
  for (; j + kSumLanes <= n; j += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) acc[l] = fixed_sum_detail::larger(acc[l], row[j + l]);
  }
  for (int l = 0; j + l < n; ++l) acc[l] = fixed_sum_detail::larger(acc[l], row[j + l]);
  return fixed_sum_detail::fold(acc, fixed_sum_detail::larger<T>);
}

// Two sums at once: f(j, a, b) adds its terms to a and b (each a partial sum).
template <typename T, typename F>
inline void fixed_sum2(int64_t n, T& sum_a, T& sum_b, F&& f) {
  T a[kSumLanes] = {}, b[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) f(j + l, a[l], b[l]);
  }
  for (int l = 0; j + l < n; ++l) f(j + l, a[l], b[l]);
  sum_a = fixed_sum_detail::fold(a);
  sum_b = fixed_sum_detail::fold(b);
}

}  // namespace loom::kernels
