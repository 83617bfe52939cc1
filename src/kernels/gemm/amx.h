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

// The bits a value of an operand is multiplied as (docs/numerics.md, "16-bit products").
inline uint16_t amx_operand_bits(float x) { return bf16_operand_bits(x); }
inline uint16_t amx_operand_bits(uint16_t bits) { return bf16_operand_bits(bf16_value(bits)); }

// A pair: `first` (k = 2q) in the lower half, `second` (2q + 1) in the upper.
template <typename Value>
uint32_t amx_pair(Value first, Value second) {
  return amx_operand_bits(first) | static_cast<uint32_t>(amx_operand_bits(second)) << 16;
}
template <typename Value>
uint32_t amx_last_pair(Value first, uint32_t pad) {  // an odd kc's last k
  return amx_operand_bits(first) | pad << 16;
}

// `count` pairs of values adjacent along a row (src[2i], src[2i + 1]) to dst[i]; the loop
// the compiler vectorizes.
template <typename Value>
void amx_adjacent_pairs(const Value* src, int64_t count, uint32_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = amx_pair(src[2 * i], src[2 * i + 1]);
}

// How GemmPath::kAmx packs (gemm.cc's Packing interface, as PairPacking).
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
    // whole: the pairs of both values inside kc in full 16-pair blocks; the pairs after them
    // (to `pairs`) lie side by side too, in a block or in the rest
    const int64_t depth = (kc + 1) / 2, pairs = kc / 2, whole = pairs / kAmxPairs * kAmxPairs;
    for (int64_t s = 0; s * mr < rows; ++s) {
      uint32_t* sliver = out + s * stride;
      const int64_t height = std::min<int64_t>(mr, rows - s * mr);
      if (!x.trans) {  // each row's pairs are adjacent values: 16 at a time into its tile rows
        for (int64_t r = 0; r < height; ++r) {
          const Value* src = x.p + (i0 + s * mr + r) * x.ld + p0;
          for (int64_t q0 = 0; q0 < whole; q0 += kAmxPairs)
            amx_adjacent_pairs(src + 2 * q0, kAmxPairs, sliver + amx_a_index(r, q0, depth, mr));
          amx_adjacent_pairs(src + 2 * whole, pairs - whole, sliver + amx_a_index(r, whole, depth, mr));
          if (kc & 1) sliver[amx_a_index(r, pairs, depth, mr)] = amx_last_pair(src[kc - 1], kAmxPadA);
        }
      } else {  // op(A)(i, k) at x.p[k * ld + i]: two rows of the stored matrix make a pair
        for (int64_t q = 0; q < depth; ++q) {
          const Value* first = x.p + (p0 + 2 * q) * x.ld + i0 + s * mr;
          const Value* second = first + x.ld;
          const bool last = 2 * q + 1 == kc;
          // pair q of row r at at0 + r * step (16 in a full block, the rest's length after)
          const int64_t at0 = amx_a_index(0, q, depth, mr), step = amx_a_index(1, q, depth, mr) - at0;
          for (int64_t r = 0; r < height; ++r)
            sliver[at0 + r * step] = last ? amx_last_pair(first[r], kAmxPadA) : amx_pair(first[r], second[r]);
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
      } else {  // op(B)(k, j) at x.p[j * ld + k]: each column's pairs are adjacent values
        for (int64_t j = 0; j < width; ++j) {
          const Value* src = x.p + (js + j) * x.ld + p0;
          for (int64_t q = 0; q < kc / 2; ++q) sliver[q * nr + j] = amx_pair(src[2 * q], src[2 * q + 1]);
          if (kc & 1) sliver[(kc / 2) * nr + j] = amx_last_pair(src[kc - 1], kAmxPadB);
        }
      }
      if (width < nr)
        for (int64_t q = 0; q < depth; ++q) std::fill(sliver + q * nr + width, sliver + (q + 1) * nr, 0u);
    }
  }
};

// The AMX kernel's arithmetic in plain C++ on the same slivers, tdpbf16ps as the SDM
// defines it: per element of C, from C or +0, per step of 16 pairs an even and an odd chain
// from +0, then C += (even + odd); every sum rounded to nearest even and flushed when
// subnormal, C read so.
inline void microkernel_amx_twin(int64_t depth, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                                 bool accumulate) {
  const auto lower = [](uint32_t x) { return bf16_value(static_cast<uint16_t>(x)); };
  const auto upper = [](uint32_t x) { return bf16_value(static_cast<uint16_t>(x >> 16)); };
  for (int r = 0; r < kAmxRows; ++r)
    for (int j = 0; j < kAmxCols; ++j) {
      float acc = accumulate ? c[r * ldc + j] : 0.0f;
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
