// Loom's GEMM for a few rows of C (decoding: one row per sequence), without packing.
// Internal to src/kernels/gemm/. A packed micro-kernel computes MR rows (12 with AVX-512)
// whatever m is, and packs all of op(B) first: for m = 1 that is 12x the multiply-adds and a
// copy of the weights per call. Here op(B) is read in place: a row of C alone streams it
// through one block of accumulators; 2 to 4 take 4 rows x 64 columns at a time in
// registers, 5 to 32 take 8 rows x 32 (each value of B used by 4 or 8 rows). The order of
// arithmetic is the one gemm.h fixes (each element one chain of fused multiply-adds over
// p = 0, 1, ..., k-1 from C or +0), so the bits are the packed path's and the reference's.
// Measured on one AVX-512 core (k 256, n 1024): m = 1, 4, 8, 16 take 22, 36, 37, 62 us here
// against 22, 58, 74, 102 us packed (packing op(B) is most of a small product's time).
// Up to 32 rows, as a decoding step has when a prompt joins the running sequences, it still
// leads: m = 25 took 55 against 83 us (n 768, k 256) and 76 against 115 us (n 256, k 1024).
// The register tiles read and write C in place, with no buffer between, and ask for op(B)'s
// row 32 rows ahead: a weight matrix's rows are 1-4 KB apart, so the hardware's prefetchers
// (which stop at each 4 KB page) left a decoding step's reads of the weights waiting on
// memory; 16 sequences' step took 5-11% less (docs/perf.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::kernels::gemm_detail {

// The most rows this path takes; more share packed panels better.
constexpr int64_t kSkinnyRows = 32;
constexpr int64_t kSkinnyCols = 256;  // columns of C per block of accumulators (stays in L1)
constexpr int64_t kPrefetchRows = 32;  // a register tile asks for op(B)'s row p + this at row p

// R rows x W columns of C (W a multiple of the vector width, held in registers) over all
// of k: C[r][j] = fma chain over p of a[r][p] x b[p][j], from C's values or from +0. C is
// read and written in place: a copy through a buffer cost a third of a tile's time.
template <typename T, int R, int W>
void skinny_tile(int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  T s[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) s[r][j] = accumulate ? c[r * ldc + j] : T(0);
  for (int64_t p = 0; p < k; ++p) {
    const T* row = b + p * ldb;
    if (p + kPrefetchRows < k)
      for (int j = 0; j < W; j += 64 / static_cast<int>(sizeof(T))) __builtin_prefetch(row + kPrefetchRows * ldb + j);
    for (int r = 0; r < R; ++r) {
      const T x = a[r * lda + p];
#pragma omp simd
      for (int j = 0; j < W; ++j) s[r][j] = std::fma(x, row[j], s[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) c[r * ldc + j] = s[r][j];
}

// skinny_tile for `rows` rows, 1 <= rows <= N, in a tile of N rows.
template <typename T, int N, int W>
void skinny_tile_rows(int64_t rows, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, bool accumulate, T* c,
                      int64_t ldc) {
  if (rows == N) return skinny_tile<T, N, W>(k, a, lda, b, ldb, accumulate, c, ldc);
  if constexpr (N > 1) skinny_tile_rows<T, N - 1, W>(rows, k, a, lda, b, ldb, accumulate, c, ldc);
}

// C's m rows x w columns (w a multiple of W) [+]= A @ B's columns, R x W register tiles at
// a time (16 vector accumulators either way: 4 x 64 or 8 x 32 floats with AVX-512), the
// last rows in a smaller tile.
template <typename T, int R, int W>
void skinny_tiles(int64_t m, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, bool accumulate, T* c,
                  int64_t ldc, int64_t w) {
  for (int64_t j = 0; j < w; j += W)
    for (int64_t r0 = 0; r0 < m; r0 += R)
      skinny_tile_rows<T, R, W>(std::min<int64_t>(R, m - r0), k, a + r0 * lda, lda, b + j, ldb, accumulate,
                                c + r0 * ldc + j, ldc);
}

// Columns [j0, j0 + cols) of C (m rows, m <= kSkinnyRows) = [C +] A (m, k) @ op(B).
template <typename T>
void skinny_block(int64_t m, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, bool trans_b,
                  bool accumulate, T* c, int64_t ldc, int64_t j0, int64_t cols) {
  constexpr int64_t kCols = kSkinnyCols;
  for (int64_t jb = j0; jb < j0 + cols; jb += kCols) {
    const int64_t w = std::min(kCols, j0 + cols - jb);
    T* cb = c + jb;
    if (!trans_b && m >= 2 && m <= 4 && w % 64 == 0) {  // 4 rows x 64 columns in registers
      skinny_tiles<T, 4, 64>(m, k, a, lda, b + jb, ldb, accumulate, cb, ldc, w);
    } else if (!trans_b && m > 4 && w % 32 == 0) {  // 8 rows x 32 columns
      skinny_tiles<T, 8, 32>(m, k, a, lda, b + jb, ldb, accumulate, cb, ldc, w);
    } else if (!trans_b) {  // one row streams op(B) through a block of accumulators
      T acc[kSkinnyRows][kCols];
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < w; ++j) acc[r][j] = accumulate ? cb[r * ldc + j] : T(0);
      for (int64_t p = 0; p < k; ++p) {
        const T* row = b + p * ldb + jb;
        for (int64_t r = 0; r < m; ++r) {
          const T x = a[r * lda + p];
          T* out = acc[r];
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) out[j] = std::fma(x, row[j], out[j]);
        }
      }
      for (int64_t r = 0; r < m; ++r) std::copy(acc[r], acc[r] + w, cb + r * ldc);
    } else {
      // op(B)[p][j] = b[j * ldb + p]: a column of op(B) is a row in memory. 32 columns at a
      // time are copied into a (k, 32) buffer, which the register tiles then read as above
      // (a plain chain per output would wait on each FMA's latency).
      std::vector<T> bt(static_cast<size_t>(k * 32));
      for (int64_t j = 0; j < w; j += 32) {
        const int64_t wc = std::min<int64_t>(32, w - j);
        for (int64_t jj = 0; jj < 32; ++jj)
          for (int64_t p = 0; p < k; ++p) bt[p * 32 + jj] = jj < wc ? b[(jb + j + jj) * ldb + p] : T(0);
        for (int64_t r0 = 0; r0 < m; r0 += 8) {
          const int64_t rows = std::min<int64_t>(8, m - r0);
          T* ct = cb + r0 * ldc + j;
          if (wc == 32) {
            skinny_tile_rows<T, 8, 32>(rows, k, a + r0 * lda, lda, bt.data(), 32, accumulate, ct, ldc);
            continue;
          }
          T tile[8][32];  // the last columns: a full tile, its padded lanes discarded
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t jj = 0; jj < 32; ++jj) tile[r][jj] = accumulate && jj < wc ? ct[r * ldc + jj] : T(0);
          skinny_tile_rows<T, 8, 32>(rows, k, a + r0 * lda, lda, bt.data(), 32, /*accumulate=*/true, tile[0], 32);
          for (int64_t r = 0; r < rows; ++r) std::copy(tile[r], tile[r] + wc, ct + r * ldc);
        }
      }
    }
  }
}

}  // namespace loom::kernels::gemm_detail
