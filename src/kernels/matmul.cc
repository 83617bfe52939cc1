#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>

namespace loom::kernels {

template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t k,
                    int64_t m, WeightLayout layout) {
  T beta = 0;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) std::copy(bias, bias + m, out + i * m);
    beta = 1;
  }
  if (layout == WeightLayout::kKM)
    gemm<T>(false, false, n, m, k, 1, inp, k, weight, m, beta, out, m);
  else
    gemm<T>(false, true, n, m, k, 1, inp, k, weight, k, beta, out, m);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t n, int64_t k, int64_t m, WeightLayout layout) {
  if (layout == WeightLayout::kKM) {
    if (dinp != nullptr) gemm<T>(false, true, n, k, m, 1, dout, m, weight, m, 0, dinp, k);
    gemm<T>(true, false, k, m, n, 1, inp, k, dout, m, 1, dweight, m);
  } else {
    if (dinp != nullptr) gemm<T>(false, false, n, k, m, 1, dout, m, weight, k, 0, dinp, k);
    gemm<T>(true, false, m, k, n, 1, dout, m, inp, k, 1, dweight, k);
  }
  if (dbias != nullptr) {
    // Columns split across threads; each column summed over rows in order: deterministic
    // whatever the thread count.
    constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < m; c0 += kCols) {
      int64_t c1 = std::min(m, c0 + kCols);
      T acc[kCols] = {};
      for (int64_t i = 0; i < n; ++i) {
        const T* row = dout + i * m;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, WeightLayout);
template void matmul_forward<double>(double*, const double*, const double*, const double*,
                                     int64_t, int64_t, int64_t, WeightLayout);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, WeightLayout);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, WeightLayout);

}  // namespace loom::kernels
