// The AVX-512 micro-kernel: 12 rows x 32 columns of C in 24 zmm accumulators (of 32); per
// step of k, two vector loads of packed B and 12 broadcasts of packed A feed 24 FMAs. This
// file is compiled with -mavx512f -mfma (src/kernels/CMakeLists.txt) and only ever called
// after CPUID reports AVX-512F.
#include <immintrin.h>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/microkernel_simd.h"
#include "kernels/gemm/panel_tiles.h"

namespace loom::kernels::gemm_detail {
namespace {

struct Zmm {
  using Reg = __m512;
  using Packed = float;
  using Operand = Reg;
  static constexpr int kLanes = 16;
  static Reg load(const float* p) { return _mm512_load_ps(p); }
  static Reg loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg pin(Reg r) {  // the value stays in a register (panel_tiles.h)
    asm("" : "+v"(r));
    return r;
  }
};

// Panel tiles: 1-2 rows x 8 vectors (4 slivers), 3-4 rows x 4, then 8 rows x 2 (one
// sliver): 16 accumulators each, with the pinned row of B 25, 21 and 19 of 32 registers.
void panel_block_avx512(int64_t m, int64_t k, const float* a, int64_t lda, const float* panels, int64_t n, int64_t s0,
                        int64_t s1, bool accumulate, float* c, int64_t ldc) {
  panel_block<Zmm, PanelShapes<2, 8, 4, 4, 8, 2>>(m, k, a, lda, panels, n, s0, s1, accumulate, c, ldc);
}

}  // namespace

// A 12 x 512 sliver of A (24 KiB) sits in L1 while 512 x 256 of packed B (512 KiB) stays in
// the 1-2 MiB L2 of AVX-512 cores; KC = 512 halves the passes over C against 256 (measured:
// square 2048 went from 79% to 82% of the FMA peak on one Zen 5 core). Where op(B) spans
// several panels or is transposed, tiles of up to 1032 rows: every row tile packs all of
// op(B) again, from memory, and at 480 rows that was a ninth of a square 2048 product on one
// core; with 2 tiles instead of 5, a twentieth (the tile's packed A, 2 MiB, then streams
// from L3 a sliver at a time). Square 2048 went from ~80% to ~85% of the FMA peak; the
// transposed input-gradient shapes of gpt-mini and gpt2-124m gained 3-15% (timed per phase
// in one process, best of 7).
const MicroKernel<float> kAvx512Kernel = {"avx512", 12, 32, 512, 480, 256, 1032, simd_kernel<Zmm, 12>,
                                          simd_fma_loop<Zmm, 16>, simd_kernel<Zmm, 12, 4>, simd_kernel<Zmm, 12, 8>,
                                          simd_kernel_direct_rows<Zmm, 12>};
const PanelBlockFn kAvx512PanelBlock = panel_block_avx512;

}  // namespace loom::kernels::gemm_detail
