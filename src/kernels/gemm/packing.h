// How Loom's GEMM packs its operands (gemm.cc): op(A) into MR-row slivers and op(B) into
// NR-column slivers, as values (f32, f64; 16-bit values in f32 slivers) or as bf16 pairs for
// vdpbf16ps, and the MXCSR state the f32 kernels need for bf16 products. Internal to
// src/kernels/gemm/. Every packer writes what microkernel.h's layout says, zero-padded past
// the matrix edge.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/gemm/microkernel.h"
#include "kernels/precision.h"

namespace loom::kernels::gemm_detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A view of op(X): element (i, j) of the logical matrix.
template <typename T>
struct Operand {
  const T* p;
  int64_t ld;
  bool trans;
};

// A full sliver of MR rows of an untransposed A, column by column: the MR values of one
// column are read side by side and written together. Row by row, the writes fell MR values
// apart; this order took packing A from 28% to 11% of a 2048 x 256 x 1024 NT product's time
// (the input gradient of gpt-mini's fc), and from 5% to 2% of a square 2048 one.
template <int MR, typename T>
void pack_a_columns(const T* src, int64_t ld, int64_t kc, T* out) {
  for (int64_t q = 0; q < kc; ++q, out += MR) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) out[r] = src[r * ld + q];
  }
}

// out[q * mr + r] = op(A)(i0 + r, p0 + q) for r < rows, zero for rows <= r < mr.
template <typename T>
void pack_a(const Operand<T>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out) {
  if (!a.trans && rows == mr) {  // every kernel's MR: AVX-512 12, AVX2 6, generic 4
    const T* src = a.p + i0 * a.ld + p0;
    if (mr == 12) return pack_a_columns<12>(src, a.ld, kc, out);
    if (mr == 6) return pack_a_columns<6>(src, a.ld, kc, out);
    if (mr == 4) return pack_a_columns<4>(src, a.ld, kc, out);
  }
  if (!a.trans) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = a.p + (i0 + r) * a.ld + p0;
      for (int64_t q = 0; q < kc; ++q) out[q * mr + r] = src[q];
    }
  } else {
    for (int64_t q = 0; q < kc; ++q)
      std::memcpy(out + q * mr, a.p + (p0 + q) * a.ld + i0, rows * sizeof(T));
  }
  if (rows < mr)
    for (int64_t q = 0; q < kc; ++q) std::fill(out + q * mr + rows, out + (q + 1) * mr, T(0));
}

// NR-column slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols), each kc x nr, p-major, zero-padded.
template <typename T>
void pack_b(const Operand<T>& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) {
  for (int64_t s = 0; s * nr < cols; ++s) {
    T* dst = out + s * kc * nr;
    const int64_t js = j0 + s * nr, width = std::min<int64_t>(nr, cols - s * nr);
    if (!b.trans) {
      for (int64_t q = 0; q < kc; ++q) {
        std::memcpy(dst + q * nr, b.p + (p0 + q) * b.ld + js, width * sizeof(T));
        std::fill(dst + q * nr + width, dst + (q + 1) * nr, T(0));
      }
    } else {
      // Transposing: 32 values of k at a time, so the slice of the sliver being written
      // (32 rows of nr) stays in L1 while every source row is read.
      for (int64_t q0 = 0; q0 < kc; q0 += 32) {
        const int64_t depth = std::min<int64_t>(32, kc - q0);
        for (int64_t j = 0; j < width; ++j) {
          const T* src = b.p + (js + j) * b.ld + p0 + q0;
          for (int64_t q = 0; q < depth; ++q) dst[(q0 + q) * nr + j] = src[q];
        }
      }
      if (width < nr)
        for (int64_t q = 0; q < kc; ++q) std::fill(dst + q * nr + width, dst + (q + 1) * nr, T(0));
    }
  }
}

// Packed pairs for vdpbf16ps (microkernel.h): op(X)'s values k = p and p + 1 as one
// uint32_t, p in the upper half (multiplied first), converted by the AVX512_BF16 packers.
// An odd last k is paired with -0 in A and +0 in B: their product, -0, leaves every
// accumulator as it is (x + -0 = x, for x = -0 too).
constexpr uint32_t kPadA = 0x8000u, kPadB = 0x0000u;

// An operand's value: an f32 as it is, bf16 bits as the f32 they hold.
inline float operand_value(float x) { return x; }
inline float operand_value(uint16_t bits) { return bf16_value(bits); }

// The pairs of an odd block's last k (row `last` of op(X), values i < count), each with the
// pad in its lower half, into slivers `width` wide and `sliver` apart at pair index `pairs`.
template <typename Value>
void pack_last_k(const Value* last, int64_t count, uint32_t pad, int64_t pairs, int64_t width, int64_t sliver,
                 uint32_t* out) {
  for (int64_t i = 0; i < count; ++i)
    out[(i / width) * sliver + pairs * width + i % width] =
        static_cast<uint32_t>(bf16_operand_bits(operand_value(last[i]))) << 16 | pad;
}

// Lanes count .. width - 1 of a last partial sliver (depth steps of width; slivers `stride`
// apart) set to zero.
inline void zero_sliver_tail(uint32_t* sliver, int64_t count, int64_t width, int64_t depth, int64_t stride) {
  if (count % width == 0) return;
  uint32_t* s = sliver + (count / width) * stride;
  for (int64_t q = 0; q < depth; ++q) std::fill(s + q * width + count % width, s + (q + 1) * width, 0u);
}

// The packers' two sources: f32 values, or bf16 bits (16-bit storage) giving the same pairs.
inline void pack_rows(const float* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                      int64_t sliver) {
  kAvx512Bf16Packers.rows(x, ld, count, pairs, out, width, sliver);
}
inline void pack_rows(const uint16_t* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                      int64_t sliver) {
  kAvx512Bf16Packers.bits_rows(x, ld, count, pairs, out, width, sliver);
}
inline void pack_block(const float* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out,
                       int64_t stride) {
  kAvx512Bf16Packers.block(x, ld, rows, values, pad, out, stride);
}
inline void pack_block(const uint16_t* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out,
                       int64_t stride) {
  kAvx512Bf16Packers.bits_block(x, ld, rows, values, pad, out, stride);
}

// A tile's MR-row slivers of op(A) (rows [i0, i0 + rows) x k [p0, p0 + kc)) as pairs, sliver
// s at out + s * stride (PairPacking::a_stride): out[q * mr + r] of a sliver = the pair
// (op(A)(r, p0 + 2q), op(A)(r, p0 + 2q + 1)); rows past the tile zero. A transposed A (a
// weight gradient's activations) is read a row pair at a time across the whole tile: sliver
// by sliver, each read took 48 bytes from rows thousands of bytes apart. Value: float, or
// uint16_t (bf16 bits: the same pairs).
template <typename Value>
void pack_a_pairs(const Operand<Value>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, uint32_t* out,
                  int64_t stride) {
  const int64_t pairs = kc / 2, depth = (kc + 1) / 2;
  if (!a.trans) {
    for (int64_t r = 0; r < rows; r += mr)  // MR <= 16: one block per sliver
      pack_block(a.p + (i0 + r) * a.ld + p0, a.ld, static_cast<int>(std::min<int64_t>(mr, rows - r)), kc, kPadA,
                 out + (r / mr) * stride, mr);
  } else {
    pack_rows(a.p + p0 * a.ld + i0, a.ld, rows, pairs, out, mr, stride);
    if (kc & 1) pack_last_k(a.p + (p0 + kc - 1) * a.ld + i0, rows, kPadA, pairs, mr, stride, out);
  }
  zero_sliver_tail(out, rows, mr, depth, stride);
}

// NR-column slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols) as pairs, each depth x nr.
template <typename Value>
void pack_b_pairs(const Operand<Value>& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, uint32_t* out) {
  const int64_t pairs = kc / 2, depth = (kc + 1) / 2;
  if (!b.trans) {
    pack_rows(b.p + p0 * b.ld + j0, b.ld, cols, pairs, out, nr, nr * depth);
    if (kc & 1) pack_last_k(b.p + (p0 + kc - 1) * b.ld + j0, cols, kPadB, pairs, nr, nr * depth, out);
  } else {
    for (int64_t j = 0; j < cols; j += 16)
      pack_block(b.p + (j0 + j) * b.ld + p0, b.ld, static_cast<int>(std::min<int64_t>(16, cols - j)), kc, kPadB,
                 out + (j / nr) * nr * depth + j % nr, nr);
  }
  zero_sliver_tail(out, cols, nr, depth, nr * depth);
}

// MXCSR's flush-to-zero and denormals-are-zero bits set on this thread while it lives: the
// f32 SIMD kernels then compute bf16 products as vdpbf16ps does (microkernel.h).
class FlushSubnormals {
 public:
  explicit FlushSubnormals(bool on) : saved_(_mm_getcsr()), on_(on) { resume(); }
  ~FlushSubnormals() { suspend(); }
  // The caller's MXCSR back while code that is not a product runs (an epilogue), then set again.
  void suspend() const {
    if (on_) _mm_setcsr(saved_);
  }
  void resume() const {
    if (on_) _mm_setcsr(saved_ | 0x8040u);
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
  bool on_;
};

// What an f32 or f64 sliver holds for a value of the operand: the value itself, or the value
// a 16-bit product multiplies (gemm_half on the f32 kernels).
struct AsIs {};
struct AsBf16 {
  static float value(float x) { return bf16_operand(x); }
};
struct AsF16 {
  static float value(float x) { return f16_operand(x); }
};

// `count` packed values converted in place: one pass over the sliver just written, while
// it is in cache, in a loop the compiler vectorizes (converting each value as it was
// packed, at scattered places, held an fp16 gpt-mini step at 783 ms on one core; this pass,
// 693 ms).
template <typename Cvt, typename T>
void convert(T* x, int64_t count) {
  if constexpr (!std::is_same_v<Cvt, AsIs>)
    for (int64_t i = 0; i < count; ++i) x[i] = Cvt::value(x[i]);
}

// How a product's operands are packed: plain (f32, f64), converted to 16-bit values in f32
// slivers (Cvt: AsBf16, AsF16), or as bf16 pairs; `flush` sets MXCSR's FTZ and DAZ while
// the kernel runs.
template <typename Cvt, typename T>
struct PlainPacking {
  using P = T;
  static constexpr int kStep = 1;  // values of k per packed step
  bool flush = false;
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr; }  // slivers side by side
  void a(const Operand<T>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out, int64_t) const {
    for (int64_t r = 0; r < rows; r += mr) pack_a(x, i0 + r, std::min<int64_t>(mr, rows - r), p0, kc, mr, out + r * kc);
    convert<Cvt>(out, round_up(rows, mr) * kc);
  }
  void b(const Operand<T>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) const {
    pack_b(x, p0, kc, j0, cols, nr, out);
    convert<Cvt>(out, (cols + nr - 1) / nr * kc * nr);
  }
};
struct PairPacking {
  using P = uint32_t;
  static constexpr int kStep = 2;
  bool flush = false;
  // A's slivers one cache line further apart than their size: a transposed A is written a row
  // pair across the whole tile at a time, to every sliver (86 of them for 1032 rows), and
  // with slivers 24 KiB apart every write fell in one L1 set. Measured on one Zen 5 core:
  // gpt-mini's weight gradients (TN, k = 2048) 300-357 -> 340-370 GFLOP/s.
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr + 16; }
  template <typename Value>  // float, or uint16_t: bf16 bits
  void a(const Operand<Value>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, uint32_t* out,
         int64_t stride) const {
    pack_a_pairs(x, i0, rows, p0, kc, mr, out, stride);
  }
  template <typename Value>
  void b(const Operand<Value>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, uint32_t* out) const {
    pack_b_pairs(x, p0, kc, j0, cols, nr, out);
  }
};

}  // namespace loom::kernels::gemm_detail
