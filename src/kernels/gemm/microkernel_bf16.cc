// The AVX512_BF16 micro-kernel of bf16 products: 12 rows x 32 columns of C in 24 zmm
// accumulators, as the f32 AVX-512 kernel; per packed step (two values of k), two vector
// loads of packed B pairs and 12 broadcasts of packed A pairs feed 24 vdpbf16ps, each 32
// multiply-adds where an FMA does 16. Compiled with -mavx512f -mavx512bf16 (src/kernels/
// CMakeLists.txt) and only ever called after CPUID reports AVX512_BF16.
//
// vdpbf16ps (Intel SDM; measured on AMD Zen 4 against an emulation, kernels_test
// GemmHalf.Vdpbf16psIsTwoFlushedFmas): per f32 lane, acc = fma(upper pair, acc),
// then acc = fma(lower pair, acc), each rounded to nearest even, subnormal inputs read as
// zero and subnormal results written as zero; MXCSR is neither read nor written.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/microkernel_simd.h"

namespace loom::kernels::gemm_detail {
namespace {

// simd_kernel's traits for bf16 pairs: B's 16 pairs a vector, A's pair broadcast, and
// vdpbf16ps as the multiply-add (C's accumulators stay f32).
struct Bf16Pairs {
  using Reg = __m512;
  using Packed = uint32_t;
  using Operand = __m512bh;
  static constexpr int kLanes = 16;
  static Operand load(const uint32_t* p) { return (__m512bh)_mm512_load_si512(p); }
  static Operand broadcast(const uint32_t* p) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(*p)); }
  static Reg loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg fma(Operand a, Operand b, Reg c) { return _mm512_dpbf16_ps(c, a, b); }
};

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

// 16 pairs from two vectors of firsts and seconds: vcvtne2ps2bf16 rounds both (to nearest
// even, a subnormal read as zero, a NaN made quiet: bf16_operand_bits exactly) into
// seconds' words then firsts'; vpermw interleaves them, the first in each upper half.
inline __m512i pairs_of(__m512 firsts, __m512 seconds) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(firsts, seconds);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

// 16 pairs of adjacent values x[2i], x[2i + 1] (32 floats from x, `mask`ed): rounded in
// place, then each dword's halves swapped so the first value is in the upper one.
inline __m512i adjacent_pairs(const float* x, __mmask32 mask) {
  const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), x);
  const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask >> 16), x + 16);
  return _mm512_maskz_rol_epi32(__mmask16(0xffff), (__m512i)_mm512_cvtne2ps_pbh(hi, lo), 16);
}

// Row pairs of op(X) into slivers (PairPackers::rows); pair16(row, i, n) gives the pairs of
// columns i .. i + 15 of the rows `row` and `row + ld` (those below n) and their mask. Each
// 16 pairs go to the slivers they fall in with one masked store per sliver (two for A's
// 12-wide slivers): lane j to column (i + j) % width of sliver (i + j) / width.
// The sliver and column of each 16 pairs are stepped along, not divided out: a 64-bit
// division per 16 pairs took 83% of this loop's time (perf annotate, gpt-mini's weight
// gradient, TN 256 x 768 x 2048).
// A's 12-wide slivers take 48 columns (three vectors of pairs) at a time, realigned into
// four slivers' rows with valignd, one 12-lane store each, where every vector straddled
// two slivers and took two masked stores.
template <typename Src, typename Pair16>
void row_pairs_to_slivers(const Src* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                          int64_t sliver, Pair16 pair16) {
  const int64_t whole48 = width == 12 ? count / 48 * 48 : 0;
  for (int64_t q = 0; q < pairs; ++q, x += 2 * ld) {
    for (int64_t i = 0; i < whole48; i += 48) {
      const __m512i v0 = pair16(x, i, count).first, v1 = pair16(x, i + 16, count).first,
                    v2 = pair16(x, i + 32, count).first;
      uint32_t* base = out + (i / 12) * sliver + q * 12;
      const __mmask16 twelve = 0x0fff;
      _mm512_mask_storeu_epi32(base, twelve, v0);
      _mm512_mask_storeu_epi32(base + sliver, twelve, _mm512_alignr_epi32(v1, v0, 12));
      _mm512_mask_storeu_epi32(base + 2 * sliver, twelve, _mm512_alignr_epi32(v2, v1, 8));
      _mm512_mask_storeu_epi32(base + 3 * sliver, twelve, _mm512_alignr_epi32(v2, v2, 4));
    }
    int64_t s = whole48 / 12, off = 0;  // columns i .. i + 15 start at column off of sliver s
    for (int64_t i = whole48; i < count; i += 16) {
      const auto [v, mask] = pair16(x, i, count);
      for (int64_t t = 0; t * width - off < 16; ++t) {
        const int64_t lo = std::max<int64_t>(0, t * width - off), hi = std::min<int64_t>(16, (t + 1) * width - off);
        const auto lanes = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
        // Lane lo lands at column lo + off - t * width = 0 of sliver s + t (t > 0), or at off.
        uint32_t* base = out + (s + t) * sliver + q * width + off - t * width;
        _mm512_mask_storeu_epi32(base, lanes & mask, v);
      }
      for (off += 16; off >= width; off -= width) ++s;
    }
  }
}

inline __mmask16 first(int64_t n, int64_t i) {
  return n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
}

// The line `bytes` past p into L1, by address arithmetic: it may lie past p's array, where
// a pointer may not point.
inline void prefetch(const void* p, int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)),
               _MM_HINT_T0);
}

// Column i of the row pair four pairs on, into L1 before it is read: the rows are read 16
// values at a time, pairs `ld` apart, which the hardware prefetcher did not follow; this
// took gpt-mini's weight gradients (TN 256 x 768 x 2048, one Zen 5 core) from 259 to 345
// GFLOP/s. Past the last pair it asks for lines nobody reads: a prefetch never faults.
template <typename Src>
inline void prefetch_ahead(const Src* row, int64_t ld, int64_t i) {
  prefetch(row + i, 8 * ld * int64_t{sizeof(Src)});
  prefetch(row + i, 9 * ld * int64_t{sizeof(Src)});
}

void rows_to_pairs(const float* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                   int64_t sliver) {
  row_pairs_to_slivers(x, ld, count, pairs, out, width, sliver, [ld](const float* row, int64_t i, int64_t n) {
    const __mmask16 mask = first(n, i);
    prefetch_ahead(row, ld, i);
    return std::pair{pairs_of(_mm512_maskz_loadu_ps(mask, row + i), _mm512_maskz_loadu_ps(mask, row + ld + i)), mask};
  });
}

// The bits packers below move bf16 bits into pairs as they are, where the f32 packers' vcvtne2ps2bf16
// reads a subnormal as zero and makes a NaN quiet: vdpbf16ps does both to its own inputs (the
// SDM: DAZ whatever MXCSR says; a NaN operand comes out quiet), so a pair of raw bits and the
// same pair fixed first give every accumulator the same bits. Measured on Zen 4 for all 65,536
// words in either half of either operand, against zeros, subnormals, infinities, quiet and
// signalling NaNs and normals, and accumulators of every kind: not one lane of 1.5 billion
// differed; kernels_test GemmHalf.Vdpbf16psReadsRawBitsAsFixedOnes keeps the check. Without
// the fix (two compares and two blends per 32 words) A's slivers of a 2048 x 256 matrix of
// bits pack in 0.050 ms where they took 0.064 (in cache, one Zen 4 core).

void bits_rows_to_pairs(const uint16_t* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
                        int64_t sliver) {
  row_pairs_to_slivers(x, ld, count, pairs, out, width, sliver, [ld](const uint16_t* row, int64_t i, int64_t n) {
    const __mmask16 mask = first(n, i);
    prefetch_ahead(row, ld, i);
    // The row's 16 words in the lower half, the next row's in the upper (masked-off ones 0),
    // then interleaved: dword j = (row[j] << 16) | next[j].
    const __m512i both = _mm512_inserti64x4(
        _mm512_maskz_loadu_epi16(mask, row + i), _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(mask, row + ld + i)),
        1);
    const __m512i order = _mm512_set_epi16(15, 31, 14, 30, 13, 29, 12, 28, 11, 27, 10, 26, 9, 25, 8, 24, 7, 23, 6, 22, 5,
                                           21, 4, 20, 3, 19, 2, 18, 1, 17, 0, 16);
    return std::pair{_mm512_permutexvar_epi16(order, both), mask};
  });
}

// r[0..15] (16 x 16 dwords) transposed in registers: unpacks, then 128-bit shuffles.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
  }
}

// 16 pairs of adjacent bf16 bits x[2i], x[2i + 1] (32 words from x, `mask`ed): each dword
// holds a pair already, the first in its lower half, so its halves are swapped.
// (The maskz form of the rotate: GCC 12 calls the unmasked one's undefined source
// uninitialized here, an error under -Werror.)
inline __m512i adjacent_bits_pairs(const uint16_t* x, __mmask32 mask) {
  return _mm512_maskz_rol_epi32(__mmask16(0xffff), _mm512_maskz_loadu_epi16(mask, x), 16);
}

// Up to 16 rows (ld apart) of adjacent pairs: row r's pairs q go to out[q * stride + r].
// Per 32 values, each row's 16 pairs in one register (adjacent(row, mask): from f32 values
// or bf16 bits; a lambda, so it is inlined: a function pointer was called per row), the
// 16 x 16 block transposed, and each pair index's `rows` values stored at once (they were
// 16 scalar stores per row).
template <typename Src, typename Rows, typename Adjacent>
void block_rows(const Src* x, int64_t ld, Rows rows_given, int64_t values, uint32_t pad, uint32_t* out, int64_t stride,
                Adjacent adjacent) {
  const int rows = rows_given;
  const __mmask16 row_mask = static_cast<__mmask16>((1u << rows) - 1);
  for (int64_t v = 0; v < values; v += 32) {
    const int64_t n = std::min<int64_t>(32, values - v), pairs = (n + 1) / 2;
    const __mmask32 mask = n == 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << n) - 1);
    __m512 r[16];
    for (int i = 0; i < rows; ++i) {  // each row's 32 values two steps on (a few per cent)
      prefetch(x + i * ld + v, 64 * int64_t{sizeof(Src)});
      if (sizeof(Src) == 4) prefetch(x + i * ld + v, 80 * int64_t{sizeof(Src)});  // f32: a step is two lines
    }
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? (__m512)adjacent(x + i * ld + v, mask) : _mm512_setzero_ps();
    transpose16(r);
    if (n & 1) {  // the odd last value's pair gets the pad in its lower half
      const __m512i keep = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      r[pairs - 1] = (__m512)_mm512_or_si512(_mm512_and_si512((__m512i)r[pairs - 1], keep), _mm512_set1_epi32(static_cast<int>(pad)));
    }
    // Plain stores where all 16 lanes may be written: 16 rows, or A's 12-wide slivers, whose
    // lanes past the sliver's width fall on the next pair's, stored next (all but the call's
    // last pair). On Zen 5 this loop's samples gathered after its masked stores (perf annotate).
    uint32_t* dst = out + (v / 2) * stride;
    const bool overlap = stride < 16, final = v + 32 >= values;
    for (int64_t q = 0; q < pairs; ++q) {
      if (rows == 16 || (overlap && !(final && q == pairs - 1)))
        _mm512_storeu_si512(dst + q * stride, (__m512i)r[q]);
      else
        _mm512_mask_storeu_epi32(dst + q * stride, row_mask, (__m512i)r[q]);
    }
  }
}

// block_rows with the common counts of rows fixed when compiled: A's 12-row slivers, whose four
// zero rows' shuffles in transpose16 then fold away (A's slivers of 2048 x 1024 bits in cache:
// 0.202 -> 0.178 ms), and B's 16-column blocks.
template <typename Src, typename Adjacent>
void block_pairs(const Src* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out, int64_t stride,
                 Adjacent adjacent) {
  if (rows == 12) return block_rows(x, ld, std::integral_constant<int, 12>{}, values, pad, out, stride, adjacent);
  if (rows == 16) return block_rows(x, ld, std::integral_constant<int, 16>{}, values, pad, out, stride, adjacent);
  block_rows(x, ld, rows, values, pad, out, stride, adjacent);
}

void block_to_pairs(const float* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out, int64_t stride) {
  block_pairs(x, ld, rows, values, pad, out, stride, [](const float* p, __mmask32 m) { return adjacent_pairs(p, m); });
}

void bits_block_to_pairs(const uint16_t* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out,
                         int64_t stride) {
  block_pairs(x, ld, rows, values, pad, out, stride,
              [](const uint16_t* p, __mmask32 m) { return adjacent_bits_pairs(p, m); });
}

}  // namespace

const PairPackers kAvx512Bf16Packers = {rows_to_pairs, block_to_pairs, bits_rows_to_pairs, bits_block_to_pairs};

// The f32 AVX-512 kernel's blocking but twice its depth: bf16 values are half the bytes, so a
// 12 x 1024 sliver of A (24 KiB) and 1024 x 256 of packed B (512 KiB) take the f32 kernel's
// room in L1 and L2, and each element of C is loaded and stored half as often. Measured on
// one Zen 4 core against KC = 512: the gpt-mini shapes with k of 768 to 2048 went from
// 66-74% to 72-83% of the vdpbf16ps peak (loom bench gemm).
const MicroKernel<uint32_t, float> kAvx512Bf16Kernel = {
    "avx512_bf16", 12, 32, 1024, 1032, 256, 1032, simd_kernel<Bf16Pairs, 12>, bf16_dot_loop, simd_kernel<Bf16Pairs, 12, 4>,
    simd_kernel<Bf16Pairs, 12, 8>};

}  // namespace loom::kernels::gemm_detail
