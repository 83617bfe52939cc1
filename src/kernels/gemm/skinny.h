// Loom's GEMM for a few rows of C (decoding: one row per sequence), without packing.
// Internal to src/kernels/gemm/. A packed micro-kernel computes MR rows (12 with AVX-512)
// whatever m is, and packs all of op(B) first: for m = 1 that is 12x the multiply-adds and a
// copy of the weights per call. Here op(B) is read once, in place, and every row of C takes
// each of its values. The order of arithmetic is the one gemm.h fixes (each element one
// chain of fused multiply-adds over p = 0, 1, ..., k-1 from C or +0), so the bits are the
// packed path's and the reference's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace loom::kernels::gemm_detail {

// The most rows this path takes; more share packed panels better.
constexpr int64_t kSkinnyRows = 4;

// Columns [j0, j0 + cols) of C (m rows, m <= kSkinnyRows) = [C +] A (m, k) @ op(B).
template <typename T>
void skinny_block(int64_t m, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, bool trans_b,
                  bool accumulate, T* c, int64_t ldc, int64_t j0, int64_t cols) {
  constexpr int64_t kCols = 256;  // a block of accumulators that stays in L1
  T acc[kSkinnyRows][kCols];
  for (int64_t jb = j0; jb < j0 + cols; jb += kCols) {
    const int64_t w = std::min(kCols, j0 + cols - jb);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < w; ++j) acc[r][j] = accumulate ? c[r * ldc + jb + j] : T(0);
    if (!trans_b) {
      for (int64_t p = 0; p < k; ++p) {
        const T* row = b + p * ldb + jb;
        for (int64_t r = 0; r < m; ++r) {
          const T x = a[r * lda + p];
          T* out = acc[r];
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) out[j] = std::fma(x, row[j], out[j]);
        }
      }
    } else {  // op(B)[p][j] = b[j * ldb + p]: a column of B is a row in memory
      for (int64_t j = 0; j < w; ++j) {
        const T* col = b + (jb + j) * ldb;
        for (int64_t r = 0; r < m; ++r) {
          const T* x = a + r * lda;
          T s = acc[r][j];
          for (int64_t p = 0; p < k; ++p) s = std::fma(x[p], col[p], s);
          acc[r][j] = s;
        }
      }
    }
    for (int64_t r = 0; r < m; ++r) std::copy(acc[r], acc[r] + w, c + r * ldc + jb);
  }
}

}  // namespace loom::kernels::gemm_detail
