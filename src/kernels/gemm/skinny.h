// Loom's GEMM for a few rows of C (decoding: one row per sequence), without packing.
// Internal to src/kernels/gemm/. A packed micro-kernel computes MR rows (12 with AVX-512)
// whatever m is, and packs all of op(B) first: for m = 1 that is 12x the multiply-adds and a
// copy of the weights per call. Here op(B) is read in place: a row of C alone streams it
// through one block of accumulators; two or more take 4 rows x 64 columns at a time in
// registers (each value of B used by 4 rows). The order of arithmetic is the one gemm.h
// fixes (each element one chain of fused multiply-adds over p = 0, 1, ..., k-1 from C or
// +0), so the bits are the packed path's and the reference's. Measured on one AVX-512 core
// (k 256, n 1024): m = 1, 4, 8 take 20, 35, 67 us here against 22, 58, 74 us packed; from
// m = 12 packing wins.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace loom::kernels::gemm_detail {

// The most rows this path takes; more share packed panels better.
constexpr int64_t kSkinnyRows = 8;

// R rows x W columns of C (W a multiple of the vector width, held in registers) over all
// of k: C[r][j] = fma chain over p of a[r][p] x b[p][j], from `acc`'s values.
template <typename T, int R, int W>
void skinny_tile(int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T (*acc)[W]) {
  T s[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) s[r][j] = acc[r][j];
  for (int64_t p = 0; p < k; ++p) {
    const T* row = b + p * ldb;
    for (int r = 0; r < R; ++r) {
      const T x = a[r * lda + p];
#pragma omp simd
      for (int j = 0; j < W; ++j) s[r][j] = std::fma(x, row[j], s[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) acc[r][j] = s[r][j];
}

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
    if (!trans_b && m >= 2 && w % 64 == 0) {  // register-blocked: 4 rows x 64 columns at a time
      for (int64_t j = 0; j < w; j += 64)
        for (int64_t r0 = 0; r0 < m; r0 += 4) {
          const int64_t rows = std::min<int64_t>(4, m - r0);
          T tile[4][64];
          for (int64_t r = 0; r < rows; ++r) std::copy(acc[r0 + r] + j, acc[r0 + r] + j + 64, tile[r]);
          const T* ar = a + r0 * lda;
          const T* bj = b + jb + j;
          switch (rows) {
            case 1: skinny_tile<T, 1, 64>(k, ar, lda, bj, ldb, tile); break;
            case 2: skinny_tile<T, 2, 64>(k, ar, lda, bj, ldb, tile); break;
            case 3: skinny_tile<T, 3, 64>(k, ar, lda, bj, ldb, tile); break;
            default: skinny_tile<T, 4, 64>(k, ar, lda, bj, ldb, tile); break;
          }
          for (int64_t r = 0; r < rows; ++r) std::copy(tile[r], tile[r] + 64, acc[r0 + r] + j);
        }
    } else if (!trans_b) {
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
