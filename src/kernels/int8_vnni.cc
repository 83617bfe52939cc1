// The AVX-512 VNNI kernel of the int8 product (int8_matmul.h): vpdpbusd multiplies 64
// unsigned bytes by 64 signed bytes and adds each 4 adjacent products into 16 int32 lanes.
// With the weights in tiles (Int8Weight: 4 inputs' weights of 16 channels in one 64-byte
// load) and a row's 4 input bytes broadcast, each instruction adds 4 products to each of 16
// channels' sums: no horizontal adds. The input is taken as q + 128 (unsigned), so each sum
// is sum((q + 128) w) and 128 x sum(w) comes off at the end: exact integers, the same as the
// other paths. Compiled for AVX-512 VNNI whatever the build targets; called only after CPUID
// says the CPU has it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/int8_matmul.h"

namespace loom::kernels::int8_detail {
namespace {

// acc += a x w in 16 int32 lanes. In assembly because GCC 12, given the intrinsic, copies
// every accumulator to another register and back each step of the tile's loop.
__m512i dot(__m512i acc, __m512i a, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w));
  return acc;
}

// 16 int32 as floats (rounded to nearest, as static_cast<float>). Not _mm512_cvtepi32_ps:
// GCC 12's header trips -Wmaybe-uninitialized in it.
__m512 to_float(__m512i x) {
  typedef int32_t Ints __attribute__((vector_size(64)));
  typedef float Floats __attribute__((vector_size(64)));
  return reinterpret_cast<__m512>(__builtin_convertvector(reinterpret_cast<Ints>(x), Floats));
}

// R rows x the tile's 64 channels (4 vectors of 16): 4R sums in registers, 4 weight vectors
// a step, each used for every row. They go out as floats from the registers (Int8Out's
// steps, the same as finish_rows): storing the sums and converting them in a second loop
// took 7-14% of a 4-8 row product. A tile of fewer channels (the last, when m is not a
// multiple of 64) stages its sums for finish_rows, which stops at `cols`.
template <int R>
void part(int64_t kp, const uint8_t* au, int64_t lda, const int8_t* w, const int32_t* sum, const Int8Out& to) {
  __m512i s[R][4];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 4; ++g) s[r][g] = _mm512_setzero_si512();
  for (int64_t p = 0; p < kp; p += 4) {
    const int8_t* step = w + p * kInt8Tile;  // 4 inputs a step, 256 bytes
    __m512i wv[4];
    for (int g = 0; g < 4; ++g) {
      wv[g] = _mm512_load_si512(step + 64 * g);
      // Held in a register for every row: without this GCC 12 loaded each vector again for
      // each row of a 3-row pass (15 loads a step for 12 multiplies: 3 rows took as long as 4,
      // now 0.78 of it). One or two rows gain nothing.
      if constexpr (R >= 3) asm("" : "+v"(wv[g]));
    }
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, au + r * lda + p, 4);
      const __m512i a = _mm512_set1_epi32(four);
      for (int g = 0; g < 4; ++g) s[r][g] = dot(s[r][g], a, wv[g]);
    }
  }
  for (int g = 0; g < 4; ++g) {
    // x 128 by a multiply: GCC 12's _mm512_slli_epi32 trips -Wuninitialized inside its header.
    const __m512i offset = _mm512_mullo_epi32(_mm512_loadu_si512(sum + 16 * g), _mm512_set1_epi32(128));
    for (int r = 0; r < R; ++r) s[r][g] = _mm512_sub_epi32(s[r][g], offset);
  }
  if (to.cols < kInt8Tile) {
    int32_t staged[R * kInt8Tile];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 4; ++g) _mm512_storeu_si512(staged + r * kInt8Tile + 16 * g, s[r][g]);
    finish_rows(staged, kInt8Tile, R, to);
    return;
  }
  for (int g = 0; g < 4; ++g) {
    const __m512 sw = _mm512_loadu_ps(to.sw + 16 * g);
    const __m512 bias = to.bias != nullptr ? _mm512_loadu_ps(to.bias + 16 * g) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(to.sa[r]), sw);
      _mm512_storeu_ps(to.out + r * to.ldout + 16 * g, _mm512_fmadd_ps(to_float(s[r][g]), scale, bias));
    }
  }
}

// Up to kInt8MaxRows (6) rows in one pass over the tile (24 sums, 4 weight vectors and a
// broadcast fill 29 of the 32 registers). A pass of 1 or 2 rows costs more per row (one
// thread, 256 x 1024: 1 row 1.8 us, 2 rows 1.0 us a row, 3-6 rows 0.73-0.78), so the driver
// deals rows out in passes as even as it can (int8_matmul.cc: 7 rows are 4 + 3, 8 are 4 + 4).
void kernel(int64_t kp, const int8_t* /*a*/, const uint8_t* au, int64_t lda, int rows, const int8_t* w,
            const int32_t* sum, const Int8Out& to) {
  switch (rows) {
    case 1: part<1>(kp, au, lda, w, sum, to); break;
    case 2: part<2>(kp, au, lda, w, sum, to); break;
    case 3: part<3>(kp, au, lda, w, sum, to); break;
    case 4: part<4>(kp, au, lda, w, sum, to); break;
    case 5: part<5>(kp, au, lda, w, sum, to); break;
    default: part<6>(kp, au, lda, w, sum, to); break;
  }
}

}  // namespace

const Int8KernelFn kInt8Vnni = kernel;

}  // namespace loom::kernels::int8_detail
