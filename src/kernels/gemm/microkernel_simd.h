// The SIMD micro-kernel and FMA-peak loop, written once over a vector type. Each
// instruction set's file (microkernel_avx512.cc, microkernel_avx2.cc) defines a traits
// struct V (vector type, lane count, load/store/broadcast/fma) in its own anonymous
// namespace and instantiates these under its compile flags. Internal to src/kernels/gemm/.
//
// simd_kernel<V, MR> computes MR rows x 2 vectors of C in 2 MR accumulators: per packed
// step, two aligned loads of packed B and MR broadcasts of packed A feed 2 MR FMAs, each lane
// one output element's chain in k order (microkernel.h). V::Packed is what a packed sliver
// holds (float; or a pair of bf16, whose V::fma is vdpbf16ps: two steps of k at once),
// V::Operand the vector of it, V::Reg the f32 accumulator. simd_kernel<V, MR, Rows> computes
// only the first Rows rows of the MR-row sliver (the same chains, so the same bits): a
// sliver that holds 4 or 8 rows of C costs 4 or 8 rows, not MR (gpt-mini's 32-row attention
// blocks are 12 + 12 + 8 rows).
#pragma once

#include <cstdint>

namespace loom::kernels::gemm_detail {

// A kernel's Rows x 2 vectors of accumulators: started from `from`'s rows (ld_from apart) or
// +0, and stored to C's rows (ldc apart).
template <typename V, int Rows>
[[gnu::always_inline]] inline void start_chains(typename V::Reg (&lo)[Rows], typename V::Reg (&hi)[Rows],
                                                const float* from, int64_t ld_from) {
  if (from != nullptr) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      lo[r] = V::loadu(from + r * ld_from);
      hi[r] = V::loadu(from + r * ld_from + V::kLanes);
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) lo[r] = hi[r] = V::zero();
  }
}
template <typename V, int Rows>
[[gnu::always_inline]] inline void store_chains(float* c, int64_t ldc, const typename V::Reg (&lo)[Rows],
                                                const typename V::Reg (&hi)[Rows]) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
    V::storeu(c + r * ldc, lo[r]);
    V::storeu(c + r * ldc + V::kLanes, hi[r]);
  }
}

template <typename V, int MR, int Rows = MR>
void simd_kernel(int64_t depth, const typename V::Packed* a, const typename V::Packed* b, float* c, int64_t ldc,
                 const float* from, int64_t ld_from) {
  static_assert(Rows <= MR);
  constexpr int kW = V::kLanes;
  typename V::Reg lo[Rows], hi[Rows];
  start_chains<V>(lo, hi, from, ld_from);
  for (int64_t p = 0; p < depth; ++p, a += MR, b += 2 * kW) {
    const typename V::Operand b0 = V::load(b), b1 = V::load(b + kW);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const typename V::Operand ar = V::broadcast(a + r);
      lo[r] = V::fma(ar, b0, lo[r]);
      hi[r] = V::fma(ar, b1, hi[r]);
    }
  }
  store_chains<V>(c, ldc, lo, hi);
}

// simd_kernel's chains with op(A) read where it lies, not packed: row r's value at step p is
// a[r * lda + p], or a[p * lda + r] for a transposed A (kTransA), for the sliver's first Rows
// rows. The same fused multiply-adds in the same order, so the same bits as packing op(A)
// first. gemm_packed_b's products (the attention's blocks) meet each sliver of A with 4-16
// slivers of B, too few to pay for packing it.
template <typename V, int Rows, bool kTransA>
void simd_kernel_direct(int64_t depth, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                        const float* from, int64_t ld_from) {
  constexpr int kW = V::kLanes;
  typename V::Reg lo[Rows], hi[Rows];
  start_chains<V>(lo, hi, from, ld_from);
  for (int64_t p = 0; p < depth; ++p, b += 2 * kW) {
    const typename V::Operand b0 = V::load(b), b1 = V::load(b + kW);
    const float* ap = kTransA ? a + p * lda : a + p;
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const typename V::Operand ar = V::broadcast(kTransA ? ap + r : ap + r * lda);
      lo[r] = V::fma(ar, b0, lo[r]);
      hi[r] = V::fma(ar, b1, hi[r]);
    }
  }
  store_chains<V>(c, ldc, lo, hi);
}

// simd_kernel_direct for `rows` rows, 1 <= rows <= MR (microkernel.h, MicroKernel::direct).
template <typename V, int MR>
void simd_kernel_direct_rows(int rows, bool trans_a, int64_t depth, const float* a, int64_t lda, const float* b,
                             float* c, int64_t ldc, const float* from, int64_t ld_from) {
  if (rows == MR) {
    if (trans_a) return simd_kernel_direct<V, MR, true>(depth, a, lda, b, c, ldc, from, ld_from);
    return simd_kernel_direct<V, MR, false>(depth, a, lda, b, c, ldc, from, ld_from);
  }
  if constexpr (MR > 1) simd_kernel_direct_rows<V, MR - 1>(rows, trans_a, depth, a, lda, b, c, ldc, from, ld_from);
}

// `Chains` independent register-only FMA chains, enough to cover the FMA latency on both
// pipes; returns the flops done.
template <typename V, int Chains>
double simd_fma_loop(int64_t iters, float* sink) {
  typename V::Reg acc[Chains];
  const float x = 0.999999f, y = 1e-7f;
  const typename V::Reg vx = V::broadcast(&x), vy = V::broadcast(&y);
  // Distinct starting values, or the compiler would merge identical chains into one.
#pragma GCC unroll 16
  for (int j = 0; j < Chains; ++j) {
    const float start = static_cast<float>(j);
    acc[j] = V::broadcast(&start);
  }
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < Chains; ++j) acc[j] = V::fma(acc[j], vx, vy);
  }
  alignas(64) float out[V::kLanes];
  for (int j = 1; j < Chains; ++j) acc[0] = V::fma(acc[j], vx, acc[0]);
  V::storeu(out, acc[0]);
  *sink += out[0];
  return 2.0 * Chains * V::kLanes * static_cast<double>(iters);
}

}  // namespace loom::kernels::gemm_detail
