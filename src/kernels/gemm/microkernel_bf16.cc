// The AVX512_BF16 micro-kernel of bf16 products: 12 rows x 32 columns of C in 24 zmm
// accumulators, as the f32 AVX-512 kernel; per packed step (two values of k), two vector
// loads of packed B pairs and 12 broadcasts of packed A pairs feed 24 vdpbf16ps, each 32
// multiply-adds where an FMA does 16. Compiled with -mavx512f -mavx512bf16 (src/kernels/
// CMakeLists.txt) and only ever called after CPUID reports AVX512_BF16.
//
// vdpbf16ps (Intel SDM; measured on AMD Zen 4 against an emulation, kernels_test
// Bf16Products.TheInstructionIsTwoFlushedFmas): per f32 lane, acc = fma(upper pair, acc),
// then acc = fma(lower pair, acc), each rounded to nearest even, subnormal inputs read as
// zero and subnormal results written as zero; MXCSR is neither read nor written.
#include <immintrin.h>

#include "kernels/gemm/microkernel.h"

namespace loom::kernels::gemm_detail {
namespace {

template <int MR>
void bf16_kernel(int64_t depth, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, bool accumulate) {
  __m512 lo[MR], hi[MR];
  if (accumulate) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      lo[r] = _mm512_loadu_ps(c + r * ldc);
      hi[r] = _mm512_loadu_ps(c + r * ldc + 16);
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  }
  for (int64_t q = 0; q < depth; ++q, a += MR, b += 32) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      lo[r] = _mm512_dpbf16_ps(lo[r], ar, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], ar, b1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, lo[r]);
    _mm512_storeu_ps(c + r * ldc + 16, hi[r]);
  }
}

// The core's vdpbf16ps peak: 16 independent register-only chains (latency 6 on Zen 4, two
// a cycle where the core has two units); 64 flops per instruction.
double bf16_dot_loop(int64_t iters, float* sink) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
#pragma GCC unroll 16
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  for (int j = 1; j < kChains; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  alignas(64) float out[16];
  _mm512_store_ps(out, acc[0]);
  *sink += out[0];
  return 4.0 * 16 * kChains * static_cast<double>(iters);
}

}  // namespace

// Blocking as the f32 AVX-512 kernel's in k values; a 12 x 512 sliver of pairs is 12 KiB
// and 512 x 256 of packed B 256 KiB, half the f32 kernel's bytes.
const MicroKernel<uint32_t, float> kAvx512Bf16Kernel = {"avx512_bf16", 12, 32, 512, 480, 256, 1032,
                                                         bf16_kernel<12>, bf16_dot_loop};

}  // namespace loom::kernels::gemm_detail
