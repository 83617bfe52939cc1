#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/fast_math.h"
#include "kernels/matmul.h"

namespace loom::kernels {
namespace {
// Rows of the score matrix per GEMM. Row block [r0, r1) attends to columns [0, r1) only,
// so blocks above the diagonal are never computed: at T = 256 that is 10 of 16 blocks.
constexpr int64_t kBlock = 64;
}  // namespace

// One (batch, head) pair is one task: strided GEMMs on views of qkv, the causal softmax in
// between. Tasks run in parallel; the GEMMs inside them run single-threaded.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c,
                       int64_t nh) {
  const int64_t hs = c / nh, ld = 3 * c;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < b * nh; ++bh) {
    const int64_t bi = bh / nh, h = bh % nh;
    const T* q = qkv + bi * t * ld + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* p = att + bh * t * t;
    T* y = out + bi * t * c + h * hs;
    for (int64_t r0 = 0; r0 < t; r0 += kBlock) {
      const int64_t r1 = std::min(t, r0 + kBlock);
      gemm<T>(false, true, r1 - r0, r1, hs, q + r0 * ld, ld, k, ld, false, p + r0 * t, t);
      for (int64_t i = r0; i < r1; ++i) {
        T* row = p + i * t;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          row[j] *= scale;
          mx = std::max(mx, row[j]);
        }
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j <= i; ++j) {
          row[j] = fast_exp(row[j] - mx);
          sum += row[j];
        }
        const T inv = T(1) / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        std::fill(row + i + 1, row + t, T(0));
      }
      gemm<T>(false, false, r1 - r0, hs, r1, p + r0 * t, t, v, ld, false, y + r0 * c, c);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                        int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh, ld = 3 * c;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < b * nh; ++bh) {
    const int64_t bi = bh / nh, h = bh % nh;
    const T* q = qkv + bi * t * ld + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* dq = dqkv + bi * t * ld + h * hs;
    T* dk = dq + c;
    T* dv = dq + 2 * c;
    const T* p = att + bh * t * t;
    const T* dy = dout + bi * t * c + h * hs;
    T* ds = scratch + bh * t * t;
    // dP = dY V^T on the block-lower triangle, then softmax backward in place:
    // dS = P * (dP - sum_j P dP) * scale, zero above the diagonal.
    for (int64_t r0 = 0; r0 < t; r0 += kBlock) {
      const int64_t r1 = std::min(t, r0 + kBlock);
      gemm<T>(false, true, r1 - r0, r1, hs, dy + r0 * c, c, v, ld, false, ds + r0 * t, t);
      for (int64_t i = r0; i < r1; ++i) {
        const T* prow = p + i * t;
        T* row = ds + i * t;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j <= i; ++j) dot += prow[j] * row[j];
        for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
        std::fill(row + i + 1, row + r1, T(0));
      }
      gemm<T>(false, false, r1 - r0, hs, r1, ds + r0 * t, t, k, ld, false, dq + r0 * ld, ld);  // dQ = dS K
    }
    // Column block [c0, c1) of dK and dV only sees rows i >= c0 (causality), so each is
    // one GEMM over rows [c0, T), with nothing to accumulate.
    for (int64_t c0 = 0; c0 < t; c0 += kBlock) {
      const int64_t c1 = std::min(t, c0 + kBlock), rows = t - c0;
      gemm<T>(true, false, c1 - c0, hs, rows, ds + c0 * t + c0, t, q + c0 * ld, ld, false, dk + c0 * ld, ld);
      gemm<T>(true, false, c1 - c0, hs, rows, p + c0 * t + c0, t, dy + c0 * c, c, false, dv + c0 * ld, ld);
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                       int64_t);
// One (new row, head) pair is one task: its scores against every cached key, the softmax,
// the weighted sum of the values. A small call (one decoding token) runs on its caller's
// thread: opening a parallel region costs more than its work, and when the caller is
// already in one (sequences decoded side by side) a nested region would be a team of one.
template <typename T>
void attention_decode(T* out, const T* q, int64_t ldq, const T* const* kpages, const T* const* vpages, int64_t page,
                      int64_t past, int64_t n, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  auto task = [&](int64_t ih, std::vector<T>& scores) {
    const int64_t i = ih / nh, h = ih % nh, len = past + i + 1;
    const T* qi = q + i * ldq + h * hs;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j0 = 0, pg = 0; j0 < len; j0 += page, ++pg) {  // page by page: no division per row
      const T* kp = kpages[pg] + h * hs;
      for (int64_t j = j0; j < std::min(len, j0 + page); ++j) {
        const T* kj = kp + (j - j0) * c;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < hs; ++d) dot += qi[d] * kj[d];
        scores[j] = dot * scale;
        mx = std::max(mx, scores[j]);
      }
    }
    T sum = 0;
    for (int64_t j = 0; j < len; ++j) sum += (scores[j] = fast_exp(scores[j] - mx));
    const T inv = T(1) / sum;
    T* y = out + i * c + h * hs;
    std::fill(y, y + hs, T(0));
    for (int64_t j0 = 0, pg = 0; j0 < len; j0 += page, ++pg) {
      const T* vp = vpages[pg] + h * hs;
      for (int64_t j = j0; j < std::min(len, j0 + page); ++j) {
        const T w = scores[j] * inv;
        const T* vj = vp + (j - j0) * c;
#pragma omp simd
        for (int64_t d = 0; d < hs; ++d) y[d] += w * vj[d];
      }
    }
  };
  if (n == 1 || omp_in_parallel()) {
    std::vector<T> scores(static_cast<size_t>(past + n));
    for (int64_t ih = 0; ih < n * nh; ++ih) task(ih, scores);
    return;
  }
#pragma omp parallel
  {
    std::vector<T> scores(static_cast<size_t>(past + n));
#pragma omp for schedule(static)
    for (int64_t ih = 0; ih < n * nh; ++ih) task(ih, scores);
  }
}

template void attention_decode<float>(float*, const float*, int64_t, const float* const*, const float* const*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t);
template void attention_decode<double>(double*, const double*, int64_t, const double* const*, const double* const*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t);

template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<float>(float*, float*, const float*, const float*,
                                        const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward<double>(double*, double*, const double*, const double*,
                                         const double*, int64_t, int64_t, int64_t, int64_t);

}  // namespace loom::kernels
