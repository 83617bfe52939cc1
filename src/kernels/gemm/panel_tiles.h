// Products with a weight laid out in panels once (gemm.h, PanelMatrix), written once over a
// vector type like microkernel_simd.h: each instruction set's file instantiates
// panel_block with its traits V and its tile shapes. Internal to src/kernels/gemm/.
//
// A panel matrix holds op(B) (k, n) as slivers of kPanelCols columns, each sliver k rows of
// 32 floats one after another, zeros past n. A register tile of R rows x NV vectors reads
// its vectors' rows in sequence: one stream per sliver, which the hardware prefetchers
// follow, where op(B) in place has rows 1-4 KB apart (skinny.h).
//
// The tile loads its NV vectors of B's row p into registers once and uses each for its R
// rows. V::pin keeps them there: without it GCC folds the load into every FMA that uses it,
// and on cores that load one 512-bit vector a cycle (AMD Zen 4) a 4-row tile then waited
// on the loads (measured on gpt-mini's four shapes, one core: 4 rows at 81 GFLOP/s against
// 163 pinned).
//
// Each element of C is one chain of fused multiply-adds over p = 0, 1, ..., k-1 from C or
// +0 (gemm.h), so the bits are those of gemm() on the same op(B), and of the reference.
#pragma once

#include <algorithm>
#include <cstdint>

namespace loom::kernels::gemm_detail {

constexpr int64_t kPanelCols = 32;  // columns of one sliver

// C (R rows, NV vectors from column col) [+]= A (R rows, k) @ the panels' columns.
template <typename V, int R, int NV>
void panel_tile(int64_t k, const float* a, int64_t lda, const float* panels, int64_t col, bool accumulate, float* c,
                int64_t ldc) {
  constexpr int kL = V::kLanes;
  const float* bp[NV];  // vector v's row 0; its row p is 32 p further on
  for (int v = 0; v < NV; ++v) {
    const int64_t j = col + v * kL;
    bp[v] = panels + (j / kPanelCols) * k * kPanelCols + j % kPanelCols;
  }
  typename V::Reg s[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) s[r][v] = accumulate ? V::loadu(c + r * ldc + v * kL) : V::zero();
  for (int64_t p = 0; p < k; ++p) {
    typename V::Reg b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = V::pin(V::loadu(bp[v] + p * kPanelCols));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename V::Reg x = V::broadcast(a + r * lda + p);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) s[r][v] = V::fma(x, b[v], s[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::storeu(c + r * ldc + v * kL, s[r][v]);
}

// panel_tile for `rows` rows, 1 <= rows <= R.
template <typename V, int R, int NV>
void panel_tile_rows(int rows, int64_t k, const float* a, int64_t lda, const float* panels, int64_t col,
                     bool accumulate, float* c, int64_t ldc) {
  if (rows == R) return panel_tile<V, R, NV>(k, a, lda, panels, col, accumulate, c, ldc);
  if constexpr (R > 1) panel_tile_rows<V, R - 1, NV>(rows, k, a, lda, panels, col, accumulate, c, ldc);
}

// Tile shapes: up to R1 rows take NV1 vectors at a time, up to R2 rows NV2, more rows go in
// tiles of R3 x NV3. NV1 and NV2 are whole slivers; NV3 divides one.
template <int R1_, int NV1_, int R2_, int NV2_, int R3_, int NV3_>
struct PanelShapes {
  static constexpr int R1 = R1_, NV1 = NV1_, R2 = R2_, NV2 = NV2_, R3 = R3_, NV3 = NV3_;
};

// Columns [32 s0, min(n, 32 s1)) of C (m rows) [+]= A (m, k) @ the panels' slivers [s0, s1).
template <typename V, typename S>
void panel_block(int64_t m, int64_t k, const float* a, int64_t lda, const float* panels, int64_t n, int64_t s0,
                 int64_t s1, bool accumulate, float* c, int64_t ldc) {
  constexpr int64_t kL = V::kLanes;
  const int64_t end = std::min(n, s1 * kPanelCols), slivers_end = s1 * kPanelCols;
  const int wide = m <= S::R1 ? S::NV1 : m <= S::R2 ? S::NV2 : S::NV3;
  for (int64_t col = s0 * kPanelCols; col < end;) {
    // The last slivers, fewer than a wide tile reads: one sliver's tiles.
    const int nv = col + wide * kL <= slivers_end ? wide : S::NV3;
    const int64_t width = nv * kL;
    const int tile_rows = nv == S::NV1 && m <= S::R1 ? S::R1 : nv == S::NV2 && m <= S::R2 ? S::R2 : S::R3;
    const auto tile = [&](int rows, const float* ar, bool acc, float* cc, int64_t ldcc) {
      if (nv == S::NV1 && rows <= S::R1) {
        panel_tile_rows<V, S::R1, S::NV1>(rows, k, ar, lda, panels, col, acc, cc, ldcc);
      } else if (nv == S::NV2 && rows <= S::R2) {
        panel_tile_rows<V, S::R2, S::NV2>(rows, k, ar, lda, panels, col, acc, cc, ldcc);
      } else {
        panel_tile_rows<V, S::R3, S::NV3>(rows, k, ar, lda, panels, col, acc, cc, ldcc);
      }
    };
    for (int64_t r0 = 0; r0 < m; r0 += tile_rows) {
      const int rows = static_cast<int>(std::min<int64_t>(tile_rows, m - r0));
      float* cr = c + r0 * ldc + col;
      if (col + width <= end) {
        tile(rows, a + r0 * lda, accumulate, cr, ldc);
        continue;
      }
      // Past n: the tile runs on a copy (the panels are zero there) and keeps C's columns.
      const int64_t keep = end - col;
      constexpr int64_t kTile = std::max({S::R1 * S::NV1, S::R2 * S::NV2, S::R3 * S::NV3}) * kL;
      float t[kTile] = {};
      for (int r = 0; r < rows; ++r)
        if (accumulate) std::copy(cr + r * ldc, cr + r * ldc + keep, t + r * width);
      tile(rows, a + r0 * lda, accumulate, t, width);
      for (int r = 0; r < rows; ++r) std::copy(t + r * width, t + r * width + keep, cr + r * ldc);
    }
    col += width;
  }
}

}  // namespace loom::kernels::gemm_detail
