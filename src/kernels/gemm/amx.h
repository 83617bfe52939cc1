// bf16 products on AMX tiles (`tdpbf16ps`, GemmPath::kAmx): how the operands are packed
// for them, and a plain C++ twin of the kernel that reads the same layout, so that the
// packing and the arithmetic are tested on every CPU (gemm_test.cc), not only on one with
// AMX. Internal to src/kernels/gemm/.
//
// tdpbf16ps (Intel SDM): per f32 element of C, over the instruction's 16 pairs of k, the
// products of the pairs' even (lower) bf16 values make one chain of fused multiply-adds
// from +0 and those of the odd (upper) values another; then C += (even + odd). Every result
// is rounded to nearest even and flushed when subnormal, inputs read so; MXCSR is not
// consulted. That is not Loom's chain over k in order (microkernel.h), so this path does not
// give the other paths' bits: its own are reference::gemm_half_amx's, k taken 32 values at a
// time from the product's first (KC, 1024, is a multiple of 32, so the groups do not depend
// on blocking or threads). The pairs hold k = 2q in the lower half; an odd last k is paired
// with -0 in A and +0 in B (in the upper half), whose product, -0, changes no chain.
//
// Layout (MR = NR = 32; C's 32 x 32 block is four 16 x 16 tiles of f32):
// - a sliver of op(A), depth pairs by 32 rows: for each full block of 16 pairs, 32 rows of
//   16 pairs (a tile's 16 rows of 64 bytes, then the next tile's), then the remaining
//   depth % 16 pairs of each row, row after row (the kernel pads those to a tile with pairs
//   whose products are -0);
// - a sliver of op(B), 32 columns: pair q of column j at q * 32 + j (AMX's "VNNI" layout, one
//   128-byte row per pair; a tile takes 16 rows of 64 bytes, 16 columns).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/packing.h"
#include "kernels/precision.h"

namespace loom::kernels::gemm_detail {

constexpr int kAmxRows = 32, kAmxCols = 32;  // MR, NR
constexpr int kAmxPairs = 16;                // pairs of k per tile step (64 bytes a row)
// Blocking (microkernel.h's KC, MC and MC wide, NC), as the vdpbf16ps kernel's.
constexpr int64_t kAmxKc = 1024, kAmxMc = 1024, kAmxNc = 256;
constexpr uint32_t kAmxPadA = 0x8000u, kAmxPadB = 0x0000u;

// Where pair q of row r of an A sliver `depth` pairs deep lies (rows: the sliver's MR).
inline int64_t amx_a_index(int64_t r, int64_t q, int64_t depth, int rows) {
  const int64_t full = depth / kAmxPairs * kAmxPairs;
  if (q < full) return (q / kAmxPairs) * rows * kAmxPairs + r * kAmxPairs + q % kAmxPairs;
  return full * rows + r * (depth - full) + (q - full);
}

// The bits a value of an operand is multiplied as (docs/numerics.md, "16-bit products"):
// bf16_operand_bits(x), of an f32 x kept in the upper half of a 32-bit lane (bf16_upper), so
// a pair of f32 values is two of these and a shift, with no narrowing between.
inline uint32_t amx_operand_upper(float x) { return bf16_upper(flush_subnormal(x)); }
inline uint16_t amx_operand_bits(float x) { return bf16_operand_bits(x); }
// Of bf16 bits, in 16-bit lanes (a run of them converts 16 to a vector, not 8).
inline uint16_t amx_operand_bits(uint16_t h) { return bf16_operand_bits_of_bits(h); }

// A pair: `first` (k = 2q) in the lower half, `second` (2q + 1) in the upper; of f32 values
// in 32-bit lanes, of bf16 bits in 16-bit ones.
template <typename Value>
uint32_t amx_pair(Value first, Value second) {
  if constexpr (std::is_same_v<Value, float>) {
    return amx_operand_upper(first) >> 16 | amx_operand_upper(second);
  } else {
    return amx_operand_bits(first) | static_cast<uint32_t>(amx_operand_bits(second)) << 16;
  }
}
template <typename Value>
uint32_t amx_last_pair(Value first, uint32_t pad) {  // an odd kc's last k
  return amx_operand_bits(first) | pad << 16;
}

// A packed sliver's 32-bit pairs written as their two 16-bit halves (the lower first, as
// x86 stores them): GCC's and clang's `may_alias`, so these stores and the pairs' loads
// may refer to the same memory.
using Half = uint16_t __attribute__((may_alias));

// dst[i] = the bits value src[i] is multiplied as, i < count: a run of an operand whose
// values lie side by side along k becomes pairs by being written in order (a pair's lower
// half is the earlier k). The loop the compiler vectorizes.
template <typename Value>
void amx_operand_run(const Value* src, int64_t count, Half* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = amx_operand_bits(src[i]);
}

// out[c * ldo + r] = src[r * lds + c] for r < rows, c < cols: 4 x 4 blocks by packing.h's
// transpose4 (SSE's shuffles and unaligned moves carry a pair's 32 bits as they are, with no
// arithmetic, so NaN and subnormal patterns pass untouched), then the edges one by one.
inline void transpose_pairs(const uint32_t* src, int64_t lds, int64_t rows, int64_t cols, uint32_t* out, int64_t ldo) {
  const int64_t rows4 = rows / 4 * 4, cols4 = cols / 4 * 4;
  const auto* from = reinterpret_cast<const float*>(src);
  auto* to = reinterpret_cast<float*>(out);
  for (int64_t r = 0; r < rows4; r += 4)
    for (int64_t c = 0; c < cols4; c += 4) transpose4(from + r * lds + c, lds, to + c * ldo + r, ldo);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < rows4 ? cols4 : 0; c < cols; ++c) out[c * ldo + r] = src[r * lds + c];
}

// How GemmPath::kAmx packs (gemm.cc's Packing interface, as PairPacking). Runs of an operand
// along k are converted in order into 16-bit halves; where the layout runs across k (a
// transposed A's tile rows, a transposed B's VNNI rows) a block of 16 pairs is first made
// in a buffer the thread keeps in L1, then moved by 4 x 4 transposes. (Element by element,
// a transposed A of bf16 bits packed at 1.5 ns a value on one Zen 3 core, 0.2 ns so; every
// packer's figures: docs/perf.md, bench/gemm_packing_bench.cc.)
struct AmxPacking {
  using P = uint32_t;
  static constexpr int kStep = 2;
  bool flush = false;  // tdpbf16ps flushes by itself
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr + 16; }

  // Every MR-row sliver of rows [i0, i0 + rows) x k [p0, p0 + kc) of op(A), sliver s at
  // out + s * stride; rows past the tile are zero pairs.
  template <typename Value>
  void a(const Operand<Value>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, uint32_t* out,
         int64_t stride) const {
    const int64_t depth = (kc + 1) / 2;
    for (int64_t s = 0; s * mr < rows; ++s) {
      uint32_t* sliver = out + s * stride;
      const int64_t height = std::min<int64_t>(mr, rows - s * mr);
      if (!x.trans) {  // a row's values lie along k: each tile row (and the rest) one run
        for (int64_t r = 0; r < height; ++r) {
          const Value* src = x.p + (i0 + s * mr + r) * x.ld + p0;
          for (int64_t q0 = 0; q0 < depth; q0 += kAmxPairs) {
            const int64_t values = std::min<int64_t>(2 * kAmxPairs, kc - 2 * q0);
            Half* dst = reinterpret_cast<Half*>(sliver + amx_a_index(r, q0, depth, mr));
            amx_operand_run(src + 2 * q0, values, dst);
            if (values & 1) dst[values] = static_cast<uint16_t>(kAmxPadA);
          }
        }
      } else {  // op(A)(i, k) at x.p[k * ld + i]: two rows of the stored matrix make a pair
        alignas(64) uint32_t block[kAmxPairs][kAmxRows];  // [pair][row] of one block
        for (int64_t q0 = 0; q0 < depth; q0 += kAmxPairs) {
          const int64_t count = std::min<int64_t>(kAmxPairs, depth - q0);
          for (int64_t q = 0; q < count; ++q) {
            const Value* first = x.p + (p0 + 2 * (q0 + q)) * x.ld + i0 + s * mr;
            uint32_t* pairs = block[q];
            if (2 * (q0 + q) + 1 < kc) {
              const Value* second = first + x.ld;
              for (int64_t r = 0; r < height; ++r) pairs[r] = amx_pair(first[r], second[r]);
            } else {
              for (int64_t r = 0; r < height; ++r) pairs[r] = amx_last_pair(first[r], kAmxPadA);
            }
          }
          // pair q0 + q of row r at at0 + r * step + q (a full block's tile rows, or the rest's)
          const int64_t at0 = amx_a_index(0, q0, depth, mr), step = amx_a_index(1, q0, depth, mr) - at0;
          transpose_pairs(&block[0][0], kAmxRows, count, height, sliver + at0, step);
        }
      }
      for (int64_t r = height; r < mr; ++r)
        for (int64_t q = 0; q < depth; ++q) sliver[amx_a_index(r, q, depth, mr)] = 0u;
    }
  }

  // NR-column slivers of op(B)(p0 .. p0 + kc, j0 .. j0 + cols), each depth x nr, pair q of
  // column j at q * nr + j; columns past cols zero.
  template <typename Value>
  void b(const Operand<Value>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, uint32_t* out) const {
    const int64_t depth = (kc + 1) / 2;
    for (int64_t s = 0; s * nr < cols; ++s) {
      uint32_t* sliver = out + s * depth * nr;
      const int64_t width = std::min<int64_t>(nr, cols - s * nr), js = j0 + s * nr;
      if (!x.trans) {  // op(B)(k, j) at x.p[k * ld + j]: two rows make a row of pairs
        for (int64_t q = 0; q < depth; ++q) {
          const Value* first = x.p + (p0 + 2 * q) * x.ld + js;
          const Value* second = first + x.ld;
          uint32_t* dst = sliver + q * nr;
          if (2 * q + 1 < kc) {
            for (int64_t j = 0; j < width; ++j) dst[j] = amx_pair(first[j], second[j]);
          } else {
            for (int64_t j = 0; j < width; ++j) dst[j] = amx_last_pair(first[j], kAmxPadB);
          }
        }
      } else {  // op(B)(k, j) at x.p[j * ld + k]: a column's values lie along k, one run
        alignas(64) uint32_t block[kAmxCols][kAmxPairs];  // [column][pair] of one block
        for (int64_t q0 = 0; q0 < depth; q0 += kAmxPairs) {
          const int64_t count = std::min<int64_t>(kAmxPairs, depth - q0), values = std::min<int64_t>(2 * count, kc - 2 * q0);
          for (int64_t j = 0; j < width; ++j) {
            Half* dst = reinterpret_cast<Half*>(block[j]);
            amx_operand_run(x.p + (js + j) * x.ld + p0 + 2 * q0, values, dst);
            if (values & 1) dst[values] = static_cast<uint16_t>(kAmxPadB);
          }
          transpose_pairs(&block[0][0], kAmxPairs, width, count, sliver + q0 * nr, nr);
        }
      }
      if (width < nr)
        for (int64_t q = 0; q < depth; ++q) std::fill(sliver + q * nr + width, sliver + (q + 1) * nr, 0u);
    }
  }
};

// The AMX kernel's arithmetic in plain C++ on the same slivers, tdpbf16ps as the SDM
// defines it: per element of C, from `from` or +0, per step of 16 pairs an even and an odd chain
// from +0, then C += (even + odd); every sum rounded to nearest even and flushed when
// subnormal, C read so.
inline void microkernel_amx_twin(int64_t depth, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                                 const float* from, int64_t ld_from) {
  const auto lower = [](uint32_t x) { return bf16_value(static_cast<uint16_t>(x)); };
  const auto upper = [](uint32_t x) { return bf16_value(static_cast<uint16_t>(x >> 16)); };
  for (int r = 0; r < kAmxRows; ++r)
    for (int j = 0; j < kAmxCols; ++j) {
      float acc = from != nullptr ? from[r * ld_from + j] : 0.0f;
      for (int64_t q0 = 0; q0 < depth; q0 += kAmxPairs) {
        float even = 0.0f, odd = 0.0f;
        for (int64_t q = q0; q < std::min<int64_t>(q0 + kAmxPairs, depth); ++q) {
          const uint32_t x = a[amx_a_index(r, q, depth, kAmxRows)], y = b[q * kAmxCols + j];
          even = flush_subnormal(std::fma(lower(x), lower(y), even));
          odd = flush_subnormal(std::fma(upper(x), upper(y), odd));
        }
        acc = flush_subnormal(flush_subnormal(acc) + flush_subnormal(even + odd));
      }
      c[r * ldc + j] = acc;
    }
}

// In microkernel_amx.cc, compiled for AMX; called only after gemm_path_supported(kAmx).
extern const MicroKernel<uint32_t, float> kAmxKernel;

// Rows x columns [x] k of a product through AmxPacking and the twin kernel, as the kAmx path
// runs it (gemm.cc): the layout's test on any CPU.
template <typename ValueA>
void gemm_half_amx_twin(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const ValueA* a, int64_t lda,
                        const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace loom::kernels::gemm_detail
