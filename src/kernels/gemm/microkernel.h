// The micro-kernels behind Loom's GEMM and their shapes. Internal to src/kernels/gemm/.
// Legend: MR rows and NR columns of C per micro-kernel call; KC the depth of one packed
// block; MC the most rows of an output tile; NC the width of one packed panel of op(B).
//
// A micro-kernel computes one full MR x NR block of C (row stride ldc):
//   C[r][j] = [from[r][j] +] sum over p < kc of a[p * MR + r] * b[p * NR + j]
// as one fused multiply-add per p, in order p = 0, 1, ..., starting from `from`'s element
// (rows ld_from apart: C itself to accumulate, a bias row with ld_from 0) or, where from is
// null, +0. a is an MR-row sliver of op(A) packed p-major, b a NR-column sliver of op(B) packed
// p-major; both are zero-padded past the matrix edge.
//
// bf16 products (gemm_half) use the same shape on packed pairs of k (kAvx512Bf16Kernel):
// a[q * MR + r] and b[q * NR + j] each hold two bf16 values, k = 2q in the upper half and
// 2q + 1 in the lower, and one vdpbf16ps step multiplies and adds the upper pair first,
// then the lower: the same chain of fused multiply-adds over k in order, with subnormals
// read and written as zero (docs/numerics.md, "16-bit products").
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/precision.h"

namespace loom::kernels::gemm_detail {

// Below this many multiply-adds a product runs on one thread: waking the pool costs more.
constexpr int64_t kParallelMinWork = int64_t{1} << 18;

// P: what the packed slivers hold (T, or pairs of bf16 in a uint32_t); T: C's elements.
// `depth` counts packed steps: k values, or pairs of them.
template <typename P, typename T = P>
using MicroKernelFn = void (*)(int64_t depth, const P* a, const P* b, T* c, int64_t ldc, const T* from, int64_t ld_from);

template <typename P, typename T = P>
struct MicroKernel {
  const char* name;
  int mr, nr;
  int64_t kc, mc, nc;  // blocking: depth (in k values; even for pairs), tile rows, packed B panel width
  // Tile rows when packing op(B) costs most: it is wider than one panel, or transposed.
  // Each row tile packs all of op(B) again, so there fewer, taller tiles can pay even
  // though a tile's packed A outgrows L2.
  int64_t mc_wide;
  MicroKernelFn<P, T> fn;
  // The core's peak on this kernel's instruction (FMA, or vdpbf16ps), for benchmarks: runs
  // `iters` rounds of independent register-only chains and returns the flops done (result
  // kept in *sink).
  double (*fma_loop)(int64_t iters, float* sink);
  // fn on the first 4 or 8 rows of a sliver only (a still MR rows a step), for a sliver that
  // holds no more; null where the kernel has no such form (fn then does all MR rows).
  MicroKernelFn<P, T> fn4, fn8;
  // fn's chains for the first `rows` (1..MR) rows of op(A) read in place, unpacked (a at op(A)'s
  // first row and step; lda its stride, across k when trans_a), over b's `depth` packed steps:
  // f32 kernels only (null elsewhere). gemm_packed_b's products use it (simd_kernel_direct).
  void (*direct)(int rows, bool trans_a, int64_t depth, const float* a, int64_t lda, const float* b, float* c,
                 int64_t ldc, const float* from, int64_t ld_from) = nullptr;
};

// The portable kernel: plain C++ with std::fma, which GCC turns into vector FMAs where the
// build allows. Same arithmetic as the SIMD kernels, so the same bits.
template <typename T, int MR, int NR>
void microkernel_generic(int64_t kc, const T* a, const T* b, T* c, int64_t ldc, const T* from, int64_t ld_from) {
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = from != nullptr ? from[r * ld_from + j] : T(0);
  for (int64_t p = 0; p < kc; ++p, a += MR, b += NR)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = std::fma(a[r], b[j], acc[r][j]);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// The generic kernel of bf16 products: each multiply-add's result is flushed to zero when
// subnormal, and C read as zero when subnormal (the SIMD kernels get the same from MXCSR's
// FTZ and DAZ bits, vdpbf16ps by definition). The packed operands are flushed already.
template <int MR, int NR>
void microkernel_generic_ftz(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, const float* from,
                             int64_t ld_from) {
  float acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = from != nullptr ? flush_subnormal(from[r * ld_from + j]) : 0.0f;
  for (int64_t p = 0; p < kc; ++p, a += MR, b += NR)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = flush_subnormal(std::fma(a[r], b[j], acc[r][j]));
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// The FMA loop of the generic path: scalar chains (what the CPU does without SIMD).
inline double fma_loop_generic(int64_t iters, float* sink) {
  constexpr int kChains = 8;
  float acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = static_cast<float>(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = std::fma(acc[j], 0.999999f, 1e-7f);
  for (int j = 0; j < kChains; ++j) *sink += acc[j];
  return 2.0 * kChains * static_cast<double>(iters);
}

// Columns [32 s0, min(n, 32 s1)) of C (m rows) [+]= A (m, k) @ slivers [s0, s1) of a panel
// matrix (panel_tiles.h, gemm_panels).
using PanelBlockFn = void (*)(int64_t m, int64_t k, const float* a, int64_t lda, const float* panels, int64_t n,
                              int64_t s0, int64_t s1, bool accumulate, float* c, int64_t ldc);

// In microkernel_avx512.cc / microkernel_avx2.cc, compiled for those instruction sets;
// called only after CPUID says the CPU has them.
extern const MicroKernel<float> kAvx512Kernel;
extern const MicroKernel<float> kAvx2Kernel;
// In microkernel_bf16.cc (AVX512_BF16): bf16 pairs, f32 accumulators.
extern const MicroKernel<uint32_t, float> kAvx512Bf16Kernel;

// Packing pairs with the same instructions (vcvtne2ps2bf16), each pair's value k in the
// upper half (microkernel.h's layout); every value rounded as bf16_operand_bits rounds it.
struct PairPackers {
  // out[(i / width) * sliver + q * width + i % width] = (x[2q * ld + i], x[(2q + 1) * ld + i])
  // for i < count and q < pairs: rows of op(X) paired two by two, into slivers `width` wide
  // (<= 32) and `sliver` apart. Each pair of rows is read once across every sliver, so the
  // reads stream along the rows.
  void (*rows)(const float* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width, int64_t sliver);
  // out[q * stride + r] = (x[r * ld + 2q], x[r * ld + 2q + 1]) for r < rows (<= 16) and
  // q < ceil(values / 2): adjacent values of each row; an odd last value is paired with
  // `pad` (its lower half).
  void (*block)(const float* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out, int64_t stride);
  // rows, from bf16 bits (16-bit storage) instead of f32 values: the bits as they are, which
  // vdpbf16ps reads as rows' pairs of the values they hold (it reads a subnormal as zero and
  // makes a NaN quiet itself: microkernel_bf16.cc).
  void (*bits_rows)(const uint16_t* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                    int64_t sliver);
  // block, from bf16 bits: the bits as they are, read as block's pairs of their values.
  void (*bits_block)(const uint16_t* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out,
                     int64_t stride);
};
extern const PairPackers kAvx512Bf16Packers;
extern const PanelBlockFn kAvx512PanelBlock;
extern const PanelBlockFn kAvx2PanelBlock;

}  // namespace loom::kernels::gemm_detail
