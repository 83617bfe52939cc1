#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/fast_math.h"
#include "kernels/matmul.h"

namespace loom::kernels {

// One (batch, head) pair is one task: two GEMMs forward and four backward on strided views
// of qkv. Tasks run in parallel; BLAS inside them runs single-threaded.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c,
                       int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < b * nh; ++bh) {
    const int64_t bi = bh / nh, h = bh % nh;
    const T* q = qkv + bi * t * 3 * c + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* p = att + bh * t * t;
    gemm<T>(false, true, t, t, hs, scale, q, 3 * c, k, 3 * c, 0, p, t);
    for (int64_t i = 0; i < t; ++i) {
      T* row = p + i * t;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = fast_exp(row[j] - mx);
        sum += row[j];
      }
      T inv = T(1) / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      std::fill(row + i + 1, row + t, T(0));
    }
    gemm<T>(false, false, t, hs, t, 1, p, t, v, 3 * c, 0, out + bi * t * c + h * hs, c);
  }
}

template <typename T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                        int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < b * nh; ++bh) {
    const int64_t bi = bh / nh, h = bh % nh;
    const T* q = qkv + bi * t * 3 * c + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* dq = dqkv + bi * t * 3 * c + h * hs;
    T* dk = dq + c;
    T* dv = dq + 2 * c;
    const T* p = att + bh * t * t;
    const T* dy = dout + bi * t * c + h * hs;
    T* dp = scratch + bh * t * t;
    gemm<T>(false, true, t, t, hs, 1, dy, c, v, 3 * c, 0, dp, t);  // dP = dY V^T
    gemm<T>(true, false, t, hs, t, 1, p, t, dy, c, 0, dv, 3 * c);  // dV = P^T dY
    // Softmax backward in place: dS = P * (dP - sum_j P dP), scaled; zero above diagonal.
    for (int64_t i = 0; i < t; ++i) {
      const T* prow = p + i * t;
      T* row = dp + i * t;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= i; ++j) dot += prow[j] * row[j];
      for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
      std::fill(row + i + 1, row + t, T(0));
    }
    gemm<T>(false, false, t, hs, t, 1, dp, t, k, 3 * c, 0, dq, 3 * c);  // dQ = dS K
    gemm<T>(true, false, t, hs, t, 1, dp, t, q, 3 * c, 0, dk, 3 * c);   // dK = dS^T Q
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<float>(float*, float*, const float*, const float*,
                                        const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward<double>(double*, double*, const double*, const double*,
                                         const double*, int64_t, int64_t, int64_t, int64_t);

}  // namespace loom::kernels
