// The AVX2 + FMA micro-kernel: 6 rows x 16 columns of C in 12 ymm accumulators; per step
// of k, two vector loads of packed B and 6 broadcasts of packed A feed 12 FMAs (15 of the
// 16 ymm registers live). Compiled with -mavx2 -mfma (src/kernels/CMakeLists.txt) and only
// ever called after CPUID reports both.
#include <immintrin.h>

#include "kernels/gemm/microkernel.h"

namespace loom::kernels::gemm_detail {
namespace {

constexpr int kMr = 6;
constexpr int kNr = 16;

void kernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  __m256 lo[kMr], hi[kMr];
  if (accumulate) {
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r) {
      lo[r] = _mm256_loadu_ps(c + r * ldc);
      hi[r] = _mm256_loadu_ps(c + r * ldc + 8);
    }
  } else {
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p, a += kMr, b += kNr) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r);
      lo[r] = _mm256_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(ar, b1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    _mm256_storeu_ps(c + r * ldc, lo[r]);
    _mm256_storeu_ps(c + r * ldc + 8, hi[r]);
  }
}

// 12 independent FMA chains, enough to cover the FMA latency on both pipes.
double fma_loop(int64_t iters, float* sink) {
  constexpr int kChains = 12;
  __m256 acc[kChains];
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
#pragma GCC unroll 12
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], x, y);
  }
  alignas(64) float out[8];
  for (int j = 1; j < kChains; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  _mm256_store_ps(out, acc[0]);
  *sink += out[0];
  return 2.0 * kChains * 8 * static_cast<double>(iters);
}

}  // namespace

// KC x NC of packed B (128 KiB) fits the 256 KiB L2 of AVX2-era cores; a 6 KiB sliver of A
// sits in L1.
const MicroKernel<float> kAvx2Kernel = {"avx2", kMr, kNr, 256, 480, 128, kernel, fma_loop};

}  // namespace loom::kernels::gemm_detail
