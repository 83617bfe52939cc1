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
#include <limits>

namespace loom::kernels {

inline constexpr int kSumLanes = 16;

namespace fixed_sum_detail {
template <typename T>
inline T fold(T (&acc)[kSumLanes]) {
  for (int w = kSumLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
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

// The largest of x[0 .. n), NaNs skipped (-inf when all are), as a loop of std::max from
// -inf finds it, but in 16 lanes, which vectorize (the loop did not: it was a third of the
// attention's forward; std::max_element, tracking an index, was 78% of the cross-entropy's
// forward on Zen 3 at vocab 4096). Only the sign of a zero maximum may differ, and the softmax's
// results do not: x - (+-0) and e^(+-0) = 1 are the same whichever zero it is.
template <typename T>
inline T row_max(const T* x, int64_t n) {
  constexpr int kLanes = 16;
  T lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int i = 0; i < kLanes; ++i) lane[i] = lane[i] < x[j + i] ? x[j + i] : lane[i];
  }
  T mx = -std::numeric_limits<T>::infinity();
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  for (int i = 0; i < kLanes; ++i) mx = std::max(mx, lane[i]);
  return mx;
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
