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

// What an f32 or f64 sliver holds for a value of the operand: the value itself (AsIs), or
// the value a 16-bit product multiplies (gemm_half on the f32 kernels), of an f32 or of
// 16-bit bits (`widen`: the f32 the bits hold, exact; `value` of bits is `value` of that,
// as when the bits were first widened into an f32 copy of the operand).
struct AsIs {};
struct AsBf16 {
  static float value(float x) { return bf16_operand(x); }
  static float widen(uint16_t h) { return bf16_value(h); }
  static float value(uint16_t h) { return bf16_operand_of_bits(h); }  // = value(widen(h))
};
struct AsF16 {
  static float value(float x) { return f16_operand(x); }
  static float widen(uint16_t h) { return f16_value(h); }
  static float value(uint16_t h) { return f16_operand_of_bits(h); }  // = value(widen(h))
};

// An operand's element as it is first written into a sliver by the gathering packers: as
// it is, or 16-bit bits widened (their value then follows in one pass, `convert`).
template <typename Cvt, typename T, typename V>
T raw(V x) {
  if constexpr (std::is_same_v<T, V>) {
    return x;
  } else {
    return Cvt::widen(x);
  }
}

// dst[i] = what a sliver holds for src[i], i < N, for the packers that copy runs of a row.
// Plain values are copied by a size the compiler knows, a few vector moves, where a size
// known only at run time is a call into libc that for 24-64 bytes cost more than the copy
// (a memmove call per sliver row was 17% of a square 2048 product on Zen 3); conversions in
// a loop the compiler vectorizes.
template <int N, typename Cvt, typename T, typename V>
void load_values(T* dst, const V* src) {
  if constexpr (std::is_same_v<Cvt, AsIs>) {
    static_assert(std::is_same_v<T, V>);
    std::memcpy(dst, src, N * sizeof(T));
  } else {
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) dst[i] = Cvt::value(src[i]);
  }
}
// The same for a count known at run time (a sliver's tail), then zeros up to `width`.
template <typename Cvt, typename T, typename V>
void load_values(T* dst, const V* src, int64_t count, int64_t width) {
  if constexpr (std::is_same_v<Cvt, AsIs>) {
    std::memcpy(dst, src, count * sizeof(T));
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = Cvt::value(src[i]);
  }
  std::fill(dst + count, dst + width, T(0));
}

// `count` values of a sliver the gathering packers wrote converted in place: one pass over
// the sliver just written, while it is in cache, in a loop the compiler vectorizes
// (converting each value as it was gathered, at scattered places, held an fp16 gpt-mini step
// at 783 ms on one core; this pass, 693 ms).
template <typename Cvt, typename T>
void convert(T* x, int64_t count) {
  if constexpr (!std::is_same_v<Cvt, AsIs>)
    for (int64_t i = 0; i < count; ++i) x[i] = Cvt::value(x[i]);
}

// Whether the packers read f16 bits: those are made values a few rows at a time first
// (values_of_rows), where widening each in a gather or a transpose ran f16's selects one value
// at a time.
template <typename Cvt, typename V>
constexpr bool kF16Bits = std::is_same_v<Cvt, AsF16> && std::is_same_v<V, uint16_t>;

// out[r * ld_out + q] = Cvt::value(src[r * ld + q]), r < rows, q < n: in a loop the compiler
// vectorizes.
template <typename Cvt, typename T, typename V>
void values_of_rows(const V* src, int64_t ld, int64_t rows, int64_t n, T* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = 0; q < n; ++q) out[r * ld_out + q] = Cvt::value(src[r * ld + q]);
}

// Four values of a row as f32: f32 loaded, bf16 bits widened (a bf16 is the upper half of
// its f32: each 16-bit value moved up into a 32-bit lane over zeros).
inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
inline __m128 load4(const uint16_t* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

// f32 4 x 4 transposes (SSE, every x86-64 CPU): out[c * ldo + r] = src[r * lds + c] for r,
// c < 4, of f32 values or of bf16 bits widened.
template <typename V>
void transpose4(const V* src, int64_t lds, float* out, int64_t ldo) {
  __m128 r0 = load4(src), r1 = load4(src + lds), r2 = load4(src + 2 * lds), r3 = load4(src + 3 * lds);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(out, r0);
  _mm_storeu_ps(out + ldo, r1);
  _mm_storeu_ps(out + 2 * ldo, r2);
  _mm_storeu_ps(out + 3 * ldo, r3);
}

// A full sliver of MR rows of an untransposed A, column by column: out[q * MR + r] =
// raw(src[r * ld + q]). Row by row, the writes fell MR values apart; this order took packing
// A from 28% to 11% of a 2048 x 256 x 1024 NT product's time (the input gradient of
// gpt-mini's fc), and from 5% to 2% of a square 2048 one. f32 slivers go four columns at a
// time through 4 x 4 transposes (rows 4 and 5 of AVX2's 6 as pairs), of f32 values or of
// bf16 bits widened on the way (one at a time, these were a bf16 step's largest packer).
template <int MR, typename Cvt, typename T, typename V>
void pack_a_columns(const V* src, int64_t ld, int64_t kc, T* out) {
  int64_t q = 0;
  constexpr bool kWidenedBf16 = std::is_same_v<V, uint16_t> && std::is_same_v<Cvt, AsBf16>;
  if constexpr (std::is_same_v<T, float> && (std::is_same_v<V, float> || kWidenedBf16) && MR % 2 == 0) {
    for (; q + 4 <= kc; q += 4, out += 4 * MR) {
#pragma GCC unroll 4
      for (int r = 0; r + 4 <= MR; r += 4) transpose4(src + r * ld + q, ld, out + r, MR);
      if constexpr (MR % 4 == 2) {
        const V* s4 = src + (MR - 2) * ld + q;
        const __m128 x = load4(s4), y = load4(s4 + ld);
        const __m128 lo = _mm_unpacklo_ps(x, y), hi = _mm_unpackhi_ps(x, y);  // (x0 y0 x1 y1), (x2 y2 x3 y3)
        _mm_storel_pi(reinterpret_cast<__m64*>(out + MR - 2), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(out + 2 * MR - 2), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(out + 3 * MR - 2), hi);
        _mm_storeh_pi(reinterpret_cast<__m64*>(out + 4 * MR - 2), hi);
      }
    }
  }
  for (; q < kc; ++q, out += MR) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) out[r] = raw<Cvt, T>(src[r * ld + q]);
  }
}

// out[q * mr + r] = op(A)(i0 + r, p0 + q) for r < rows, zero for rows <= r < mr, then
// converted; A untransposed (a transposed A is packed a whole tile at a time,
// pack_a_transposed).
template <typename Cvt, typename T, typename V>
void pack_a(const Operand<V>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out) {
  const V* src = a.p + i0 * a.ld + p0;
  if constexpr (kF16Bits<Cvt, V>) {
    // 64 values of each row made at a time, then gathered as plain values (widened one at a
    // time in the gather, with f16's selects, packing A was 12% of an fp16 gpt-mini step on
    // one Zen 5 core: docs/perf.md).
    constexpr int64_t kChunk = 64;
    alignas(64) T values[32 * kChunk];  // every kernel's MR <= 32
    for (int64_t q0 = 0; q0 < kc; q0 += kChunk) {
      const int64_t n = std::min(kChunk, kc - q0);
      values_of_rows<Cvt>(src + q0, a.ld, rows, n, values, kChunk);
      pack_a<AsIs>(Operand<T>{values, kChunk, false}, 0, rows, 0, n, mr, out + q0 * mr);
    }
    return;
  }
  if (rows == mr && mr == 12) {  // every kernel's MR: AVX-512 12, AVX2 6, generic 4
    pack_a_columns<12, Cvt>(src, a.ld, kc, out);
  } else if (rows == mr && mr == 6) {
    pack_a_columns<6, Cvt>(src, a.ld, kc, out);
  } else if (rows == mr && mr == 4) {
    pack_a_columns<4, Cvt>(src, a.ld, kc, out);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q = 0; q < kc; ++q) out[q * mr + r] = raw<Cvt, T>(src[r * a.ld + q]);
    for (int64_t q = 0; q < kc; ++q) std::fill(out + q * mr + rows, out + (q + 1) * mr, T(0));
  }
  convert<Cvt>(out, mr * kc);
}

// Full slivers of one row: runs of W values from src into slivers `stride` apart.
template <int W, typename Cvt, typename T, typename V>
void pack_runs(const V* src, int64_t full, T* out, int64_t stride) {
  for (int64_t s = 0; s < full; ++s) load_values<W, Cvt>(out + s * stride, src + s * W);
}

// One row of an operand (`count` values side by side: a row of an untransposed B, of a
// transposed A) into slivers `width` wide and `stride` apart, converted as copied; the last
// sliver's lanes past `count` are zeros. Every kernel's MR and NR copy with a size the
// compiler knows.
template <typename Cvt, typename T, typename V>
void pack_row(const V* src, int64_t count, int width, T* out, int64_t stride) {
  if constexpr (!std::is_same_v<Cvt, AsIs>) {
    // Converted a chunk at a time in one pass the compiler vectorizes, then copied as plain
    // values: runs of MR = 6 converted as they were copied made a transposed A the slowest
    // packer of a bf16 step on AVX2 (0.8-1.0 ns a value; bench/gemm_packing_bench.cc). Runs
    // of 16 and 32 convert as whole vectors already, and the extra pass cost them.
    if (width % 16 != 0) {
      alignas(64) T row[1024];
      const int64_t chunk = 1024 / width * width;  // whole slivers, so only the last has a tail
      for (int64_t c0 = 0; c0 < count; c0 += chunk) {
        const int64_t n = std::min(chunk, count - c0);
        for (int64_t i = 0; i < n; ++i) row[i] = Cvt::value(src[c0 + i]);
        pack_row<AsIs>(row, n, width, out + (c0 / width) * stride, stride);
      }
      return;
    }
  }
  const int64_t full = count / width, tail = count % width;
  switch (width) {
    case 4: pack_runs<4, Cvt>(src, full, out, stride); break;
    case 6: pack_runs<6, Cvt>(src, full, out, stride); break;
    case 8: pack_runs<8, Cvt>(src, full, out, stride); break;
    case 12: pack_runs<12, Cvt>(src, full, out, stride); break;
    case 16: pack_runs<16, Cvt>(src, full, out, stride); break;
    case 32: pack_runs<32, Cvt>(src, full, out, stride); break;
    default:
      for (int64_t s = 0; s < full; ++s) load_values<Cvt>(out + s * stride, src + s * width, width, width);
  }
  if (tail) load_values<Cvt>(out + full * stride, src + full * width, tail, width);
}

// Every MR-row sliver of a tile of a transposed A (rows [i0, i0 + rows) of op(A), k [p0,
// p0 + kc)), sliver s at out + s * stride, converted as it is copied, zero-padded: the weight
// gradient's activations, stored (k, m). Row by row of A across the whole tile, so the reads
// stream along each row; sliver by sliver, each read took MR values from rows thousands of
// bytes apart.
template <typename Cvt, typename T, typename V>
void pack_a_transposed(const Operand<V>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out,
                       int64_t stride) {
  for (int64_t q = 0; q < kc; ++q) pack_row<Cvt>(a.p + (p0 + q) * a.ld + i0, rows, mr, out + q * mr, stride);
}

// Columns [0, width) of a sliver of a transposed B, k [0, kc): dst[q * nr + j] =
// raw(src[j * ld + q]), f32 by 4 x 4 transposes, of f32 values or of bf16 bits widened on the
// way (one at a time, bits packed at 0.6-0.75 ns a value on Zen 3: bench/gemm_packing_bench).
template <typename Cvt, typename T, typename V>
void pack_bt_columns(const V* src, int64_t ld, int64_t kc, int64_t width, int nr, T* dst) {
  int64_t j = 0;
  constexpr bool kWidenedBf16 = std::is_same_v<V, uint16_t> && std::is_same_v<Cvt, AsBf16>;
  if constexpr (std::is_same_v<T, float> && (std::is_same_v<V, float> || kWidenedBf16)) {
    for (; j + 4 <= width; j += 4) {
      int64_t q = 0;
      for (; q + 4 <= kc; q += 4) transpose4(src + j * ld + q, ld, dst + q * nr + j, nr);
      for (; q < kc; ++q)
        for (int64_t c = 0; c < 4; ++c) dst[q * nr + j + c] = raw<Cvt, T>(src[(j + c) * ld + q]);
    }
  }
  for (; j < width; ++j)
    for (int64_t q = 0; q < kc; ++q) dst[q * nr + j] = raw<Cvt, T>(src[j * ld + q]);
}

// NR-column slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols), each kc x nr, p-major,
// zero-padded, each value converted (Cvt).
template <typename Cvt, typename T, typename V>
void pack_b(const Operand<V>& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) {
  const int64_t sliver = kc * nr;
  if (!b.trans) {
    // Row by row of B across every sliver, converted as copied: each row's values are read
    // once, in order (sliver by sliver, a square 2048 product read 64 bytes from each of 256
    // rows 8 KiB apart).
    for (int64_t q = 0; q < kc; ++q) pack_row<Cvt>(b.p + (p0 + q) * b.ld + j0, cols, nr, out + q * nr, sliver);
    return;
  }
  for (int64_t s = 0; s * nr < cols; ++s) {
    T* dst = out + s * sliver;
    const int64_t js = j0 + s * nr, width = std::min<int64_t>(nr, cols - s * nr);
    // Transposing: 32 values of k at a time, so the slice of the sliver being written
    // (32 rows of nr) stays in L1 while every source row is read. f16 bits are made values
    // first, 32 of a row at a time, and transposed as plain values.
    for (int64_t q0 = 0; q0 < kc; q0 += 32) {
      const V* src = b.p + js * b.ld + p0 + q0;
      const int64_t n = std::min<int64_t>(32, kc - q0);
      if constexpr (kF16Bits<Cvt, V>) {
        alignas(64) T values[32 * 32];  // every kernel's NR <= 32
        values_of_rows<Cvt>(src, b.ld, width, n, values, 32);
        pack_bt_columns<AsIs>(static_cast<const T*>(values), 32, n, width, nr, dst + q0 * nr);
      } else {
        pack_bt_columns<Cvt>(src, b.ld, n, width, nr, dst + q0 * nr);
      }
    }
    if (width < nr)
      for (int64_t q = 0; q < kc; ++q) std::fill(dst + q * nr + width, dst + (q + 1) * nr, T(0));
    if constexpr (!kF16Bits<Cvt, V>) convert<Cvt>(dst, sliver);
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

// How a product's operands are packed: plain (f32, f64), converted to 16-bit values in f32
// slivers (Cvt: AsBf16, AsF16), or as bf16 pairs; `flush` sets MXCSR's FTZ and DAZ while
// the kernel runs.
template <typename Cvt, typename T>
struct PlainPacking {
  using P = T;
  static constexpr int kStep = 1;  // values of k per packed step
  bool flush = false;
  // Slivers one cache line further apart than their size: a transposed A is written a row
  // across the whole tile at a time, and slivers 6 KiB apart (AVX2's 6 x 256) fell in two
  // L1 sets.
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr + 64 / static_cast<int>(sizeof(T)); }
  // V: the operand's elements, T or (16-bit products) bf16 or f16 bits.
  template <typename V>
  void a(const Operand<V>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out,
         int64_t stride) const {
    if (x.trans) {
      pack_a_transposed<Cvt>(x, i0, rows, p0, kc, mr, out, stride);
    } else {
      for (int64_t r = 0; r < rows; r += mr)
        pack_a<Cvt>(x, i0 + r, std::min<int64_t>(mr, rows - r), p0, kc, mr, out + (r / mr) * stride);
    }
  }
  template <typename V>
  void b(const Operand<V>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) const {
    pack_b<Cvt>(x, p0, kc, j0, cols, nr, out);
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
