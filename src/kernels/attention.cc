#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"
#include "kernels/gemm/gemm.h"

namespace loom::kernels {
namespace {
// A score block: kRows query rows by at most kCols key columns. Row block [r0, r1) attends
// to columns [0, r1) only, so nothing above the diagonal block is computed. Column blocks
// start at multiples of kCols, which row blocks never straddle: every row has a column in
// each block it visits. At T <= kCols a row block is one block, and the online softmax
// has nothing to rescale; longer sequences keep the same 64 KiB per thread.
constexpr int64_t kRows = 64, kCols = 256;
static_assert(kCols % kRows == 0);

// One (batch, head) pair: its views of qkv (row stride 3C), out (row stride C) and lse.
template <typename T>
struct Head {
  const T *q, *k, *v;
  T* y;
  T* lse;
};

// The largest of x[0 .. n), NaNs skipped (-inf when all are), as a loop of std::max from
// -inf finds it, but in 16 lanes, which vectorize (the loop did not: it was a third of the
// attention's forward). Only the sign of a zero maximum may differ, and the softmax's
// results do not: x - (+-0) and e^(+-0) = 1 are the same whichever zero it is.
template <typename T>
T row_max(const T* x, int64_t n) {
  constexpr int kLanes = 16;
  T lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int i = 0; i < kLanes; ++i) lane[i] = lane[i] < x[j + i] ? x[j + i] : lane[i];
  T mx = -std::numeric_limits<T>::infinity();
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  for (int i = 0; i < kLanes; ++i) mx = std::max(mx, lane[i]);
  return mx;
}

// Rows [r0, r1) of one head, by online softmax over column blocks (docs/numerics.md,
// "Attention"): each block's scores S = Q K^T / sqrt(HS), the running max m and sum l of
// each row updated, y rescaled by e^(m_old - m_new) and P V added to it; y / l at the end,
// and the row's log-sum-exp m + log l for backward. s: kRows x kCols of scratch. `operands`:
// as attention_forward's.
template <typename T>
void forward_rows(const Head<T>& hd, int64_t r0, int64_t r1, int64_t c, int64_t hs, T scale, T* s, DType operands) {
  const int64_t ld = 3 * c, rows = r1 - r0;
  T m[kRows], l[kRows];
  for (int64_t c0 = 0; c0 < r1; c0 += kCols) {
    const int64_t cols = std::min(r1, c0 + kCols) - c0;
    gemm_as<T>(operands, false, true, rows, cols, hs, hd.q + r0 * ld, ld, hd.k + c0 * ld, ld, false, s, kCols);
    for (int64_t i = 0; i < rows; ++i) {
      T* row = s + i * kCols;
      const int64_t valid = std::min(cols, r0 + i - c0 + 1);  // causal: columns <= r0 + i
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j) row[j] *= scale;
      const T mx = row_max(row, valid);
      const T m_new = c0 == 0 ? mx : std::max(m[i], mx);
      const T sum = fixed_sum<T>(valid, [&](int64_t j) { return row[j] = fast_exp(row[j] - m_new); });
      std::fill(row + valid, row + cols, T(0));
      if (c0 == 0) {
        l[i] = sum;
      } else {
        const T alpha = fast_exp(m[i] - m_new);
        l[i] = l[i] * alpha + sum;
        if (alpha != T(1)) {
          T* yi = hd.y + (r0 + i) * c;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) yi[d] *= alpha;
        }
      }
      m[i] = m_new;
    }
    gemm_as<T>(operands, false, false, rows, hs, cols, s, kCols, hd.v + c0 * ld, ld, c0 != 0, hd.y + r0 * c, c);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const T inv = T(1) / l[i];
    T* yi = hd.y + (r0 + i) * c;
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) yi[d] *= inv;
    hd.lse[r0 + i] = m[i] + std::log(l[i]);
  }
}
}  // namespace

// A task is one row block of one (batch, head) pair: row blocks are independent in forward.
// Later row blocks have more columns, so they go first, and threads take tasks as they free
// up; which thread computes a block does not change its bits.
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh, DType operands) {
  const int64_t hs = c / nh, ld = 3 * c, blocks = (t + kRows - 1) / kRows;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel
  {
    std::vector<T> s(kRows * kCols);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < b * nh * blocks; ++task) {
      const int64_t rb = blocks - 1 - task / (b * nh), bh = task % (b * nh), bi = bh / nh, h = bh % nh;
      const T* q = qkv + bi * t * ld + h * hs;
      const Head<T> hd{q, q + c, q + 2 * c, out + bi * t * c + h * hs, lse + bh * t};
      forward_rows(hd, rb * kRows, std::min(t, (rb + 1) * kRows), c, hs, scale, s.data(), operands);
    }
  }
}

// One (batch, head) pair is one task (its dQ sums over key blocks, in order). Per block of
// kRows keys [c0, c1) and up to kCols of the queries that see them (rows >= c0): P again
// from the scores and the saved log-sum-exp, then (docs/numerics.md, "Attention")
// dV_c += P^T dY_r, dP = dY_r V_c^T, dS = P (dP - D) / sqrt(HS) with D_i = dY_i . Y_i (=
// sum_j P_ij dP_ij), dQ_r += dS K_c, dK_c += dS^T Q_r. Keys outermost: dK and dV, two of
// the three sums, run over up to kCols rows per GEMM. No (T, T) matrix exists.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int64_t b, int64_t t,
                        int64_t c, int64_t nh, DType operands) {
  const int64_t hs = c / nh, ld = 3 * c;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel
  {
    std::vector<T> p(kCols * kRows), ds(kCols * kRows), dsum(static_cast<size_t>(t));
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < b * nh; ++bh) {
      const int64_t bi = bh / nh, h = bh % nh;
      const T* q = qkv + bi * t * ld + h * hs;
      const T* k = q + c;
      const T* v = q + 2 * c;
      T* dq = dqkv + bi * t * ld + h * hs;
      T* dk = dq + c;
      T* dv = dq + 2 * c;
      const T* y = out + bi * t * c + h * hs;
      const T* dy = dout + bi * t * c + h * hs;
      const T* lrow = lse + bh * t;
      for (int64_t i = 0; i < t; ++i) {
        dsum[i] = fixed_sum<T>(hs, [&](int64_t d) { return dy[i * c + d] * y[i * c + d]; });
        for (T* g : {dq, dk, dv}) std::fill(g + i * ld, g + i * ld + hs, T(0));
      }
      for (int64_t c0 = 0; c0 < t; c0 += kRows) {
        const int64_t cols = std::min(t, c0 + kRows) - c0;
        for (int64_t r0 = c0; r0 < t; r0 += kCols) {
          const int64_t rows = std::min(t, r0 + kCols) - r0;
          gemm_as<T>(operands, false, true, rows, cols, hs, q + r0 * ld, ld, k + c0 * ld, ld, false, p.data(), kRows);
          for (int64_t i = 0; i < rows; ++i) {
            T* row = p.data() + i * kRows;
            const int64_t valid = std::min(cols, r0 + i - c0 + 1);  // >= 1: r0 >= c0
            const T li = lrow[r0 + i];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) row[j] = fast_exp(row[j] * scale - li);
            std::fill(row + valid, row + cols, T(0));
          }
          gemm_as<T>(operands, true, false, cols, hs, rows, p.data(), kRows, dy + r0 * c, c, true, dv + c0 * ld, ld);
          gemm_as<T>(operands, false, true, rows, cols, hs, dy + r0 * c, c, v + c0 * ld, ld, false, ds.data(), kRows);
          for (int64_t i = 0; i < rows; ++i) {
            const T* prow = p.data() + i * kRows;
            T* row = ds.data() + i * kRows;
            const int64_t valid = std::min(cols, r0 + i - c0 + 1);
            const T di = dsum[r0 + i];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) row[j] = prow[j] * (row[j] - di) * scale;
            std::fill(row + valid, row + cols, T(0));
          }
          gemm_as<T>(operands, false, false, rows, hs, cols, ds.data(), kRows, k + c0 * ld, ld, true, dq + r0 * ld, ld);
          gemm_as<T>(operands, true, false, cols, hs, rows, ds.data(), kRows, q + r0 * ld, ld, true, dk + c0 * ld, ld);
        }
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, DType);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t, int64_t, DType);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t, DType);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*, int64_t,
                                         int64_t, int64_t, int64_t, DType);

}  // namespace loom::kernels
