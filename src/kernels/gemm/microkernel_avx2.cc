// The AVX2 + FMA micro-kernel: 6 rows x 16 columns of C in 12 ymm accumulators; per step
// of k, two vector loads of packed B and 6 broadcasts of packed A feed 12 FMAs (15 of the
// 16 ymm registers live). Compiled with -mavx2 -mfma (src/kernels/CMakeLists.txt) and only
// ever called after CPUID reports both.
#include <immintrin.h>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/microkernel_simd.h"
#include "kernels/gemm/panel_tiles.h"

namespace loom::kernels::gemm_detail {
namespace {

struct Ymm {
  using Reg = __m256;
  using Packed = float;
  using Operand = Reg;
  static constexpr int kLanes = 8;
  static Reg load(const float* p) { return _mm256_load_ps(p); }
  static Reg loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg pin(Reg r) {  // the value stays in a register (panel_tiles.h)
    asm("" : "+x"(r));
    return r;
  }
};

// Panel tiles: 1-2 rows x 4 vectors (one sliver), more rows 6 x 2 (half a sliver), as the
// micro-kernel: 8 and 12 accumulators, 13 and 15 of the 16 registers with B's row.
void panel_block_avx2(int64_t m, int64_t k, const float* a, int64_t lda, const float* panels, int64_t n, int64_t s0,
                      int64_t s1, bool accumulate, float* c, int64_t ldc) {
  panel_block<Ymm, PanelShapes<2, 4, 2, 4, 6, 2>>(m, k, a, lda, panels, n, s0, s1, accumulate, c, ldc);
}

}  // namespace

// KC x NC of packed B (128 KiB) fits the 256 KiB L2 of AVX2-era cores; a 6 KiB sliver of A
// sits in L1 while it meets the panel's 8 B slivers, so the tile's packed A (1 MiB at 1032
// rows) can live in L3. Tiles of 1032 rows pack op(B) fewer times (twice for gpt-mini's 2048
// rows, not 5 times at 480): packing's share of a bf16 gpt-mini step on Zen 3, per sample of
// the micro-kernel, 0.25 -> 0.21, the micro-kernel's own samples unchanged (perf, 3 pairs).
const MicroKernel<float> kAvx2Kernel = {
    "avx2", 6, 16, 256, 1032, 128, 1032, simd_kernel<Ymm, 6>, simd_fma_loop<Ymm, 12>, simd_kernel<Ymm, 6, 4>, nullptr,
    simd_kernel_direct_rows<Ymm, 6>};
const PanelBlockFn kAvx2PanelBlock = panel_block_avx2;

}  // namespace loom::kernels::gemm_detail
