// Products with op(B) in panels (gemm.h, PanelMatrix): packing, threads over slivers, and
// the path's tiles (panel_tiles.h), or plain std::fma loops on the generic path.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <new>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/panel_tiles.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

using gemm_detail::kPanelCols;
using gemm_detail::kParallelMinWork;

// The generic path: each row's 32 columns of a sliver as one block of chains.
void panel_block_generic(int64_t m, int64_t k, const float* a, int64_t lda, const float* panels, int64_t n,
                         int64_t s0, int64_t s1, bool accumulate, float* c, int64_t ldc) {
  for (int64_t s = s0; s < s1; ++s) {
    const float* b = panels + s * k * kPanelCols;
    const int64_t j0 = s * kPanelCols, cols = std::min(kPanelCols, n - j0);
    for (int64_t r = 0; r < m; ++r) {
      float acc[kPanelCols] = {};
      if (accumulate) std::copy(c + r * ldc + j0, c + r * ldc + j0 + cols, acc);
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < kPanelCols; ++j) acc[j] = std::fma(a[r * lda + p], b[p * kPanelCols + j], acc[j]);
      std::copy(acc, acc + cols, c + r * ldc + j0);
    }
  }
}

gemm_detail::PanelBlockFn block_for(GemmPath path) {
  switch (path) {
    case GemmPath::kAvx512Bf16:
    case GemmPath::kAvx512:
      return gemm_detail::kAvx512PanelBlock;
    case GemmPath::kAvx2:
      return gemm_detail::kAvx2PanelBlock;
    default:
      return panel_block_generic;
  }
}

}  // namespace

PanelMatrix pack_panels(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb) {
  LOOM_CHECK(k >= 0 && n >= 0);
  PanelMatrix out{.k = k, .n = n};
  const auto count = static_cast<size_t>(std::max<int64_t>(1, out.slivers() * kPanelCols * k));
  constexpr std::align_val_t kAlign{64};
  out.data = std::shared_ptr<float[]>(static_cast<float*>(::operator new[](count * sizeof(float), kAlign)),
                                      [](float* p) { ::operator delete[](p, kAlign); });
  float* d = out.data.get();
  for (int64_t s = 0; s < out.slivers(); ++s)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < kPanelCols; ++j) {
        const int64_t col = s * kPanelCols + j;
        d[(s * k + p) * kPanelCols + j] = col >= n ? 0.0f : trans_b ? b[col * ldb + p] : b[p * ldb + col];
      }
  return out;
}

void panel_column(const PanelMatrix& b, int64_t j, float* out) {
  LOOM_CHECK(j >= 0 && j < b.n);
  const float* sliver = b.data.get() + j / kPanelCols * b.k * kPanelCols + j % kPanelCols;
  for (int64_t p = 0; p < b.k; ++p) out[p] = sliver[p * kPanelCols];
}

void gemm_panels(int64_t m, const float* a, int64_t lda, const PanelMatrix& b, bool accumulate, float* c,
                 int64_t ldc, const GemmEpilogue<float>& epilogue) {
  const int64_t n = b.n, k = b.k;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    if (epilogue) epilogue.fn(0, m, 0, n, c, ldc);
    return;
  }
  const GemmPath path = gemm_active_path();
  const gemm_detail::PanelBlockFn block = block_for(path);
  // Threads take runs of whole slivers (as gemm's few-row path takes columns): no split
  // touches k, so the bits do not depend on the thread count.
  const bool parallel = omp_get_level() == 0 && m * n * k >= kParallelMinWork;
  const int threads = parallel ? omp_get_max_threads() : 1;
  const int64_t slivers = b.slivers(), chunk = (slivers + threads - 1) / threads;
  const auto run = [&](int64_t s0) {
    const int64_t s1 = std::min(slivers, s0 + chunk);
    block(m, k, a, lda, b.data.get(), n, s0, s1, accumulate, c, ldc);
    const int64_t j0 = s0 * kPanelCols;
    if (epilogue) epilogue.fn(0, m, j0, std::min(n, s1 * kPanelCols) - j0, c + j0, ldc);
  };
  if (threads == 1) {
    run(0);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t s0 = 0; s0 < slivers; s0 += chunk) run(s0);
}

}  // namespace loom::kernels
