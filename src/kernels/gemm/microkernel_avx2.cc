// The AVX2 + FMA micro-kernel: 6 rows x 16 columns of C in 12 ymm accumulators; per step
// of k, two vector loads of packed B and 6 broadcasts of packed A feed 12 FMAs (15 of the
// 16 ymm registers live). Compiled with -mavx2 -mfma (src/kernels/CMakeLists.txt) and only
// ever called after CPUID reports both.
#include <immintrin.h>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/microkernel_simd.h"

namespace loom::kernels::gemm_detail {
namespace {

struct Ymm {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static Reg load(const float* p) { return _mm256_load_ps(p); }
  static Reg loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

// KC x NC of packed B (128 KiB) fits the 256 KiB L2 of AVX2-era cores; a 6 KiB sliver of A
// sits in L1.
const MicroKernel<float> kAvx2Kernel = {
    "avx2", 6, 16, 256, 480, 128, 480, simd_kernel<Ymm, 6>, simd_fma_loop<Ymm, 12>};

}  // namespace loom::kernels::gemm_detail
