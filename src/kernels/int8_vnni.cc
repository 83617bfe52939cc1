// The AVX-512 VNNI kernel of the int8 product (int8_matmul.h): vpdpbusd multiplies 64
// unsigned bytes by 64 signed bytes and adds each 4 adjacent products into 16 int32 lanes.
// The input is taken as q + 128 (unsigned), so each sum is sum((q + 128) w) and 128 x sum(w)
// comes off at the end: exact integers, the same as the other paths. Compiled for AVX-512
// VNNI whatever the build targets; called only after CPUID says the CPU has it.
#include <immintrin.h>

#include "kernels/int8_matmul.h"

namespace loom::kernels::int8_detail {
namespace {

// Through memory: GCC 12's own reductions (_mm512_reduce_add_epi32, the 256-bit casts)
// trip -Wuninitialized inside its headers. Once per output, off the hot loop.
int32_t horizontal_sum(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  int32_t s = 0;
  for (int32_t x : lanes) s += x;
  return s;
}

template <int R, int C>
void block(int64_t kp, const uint8_t* const* au, const int8_t* const* w, const int32_t* sum, int32_t* acc,
           int64_t ldacc) {
  __m512i s[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r][c] = _mm512_setzero_si512();
  for (int64_t p = 0; p < kp; p += 64) {
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_load_si512(w[c] + p);
    for (int r = 0; r < R; ++r) {
      const __m512i a = _mm512_load_si512(au[r] + p);
      for (int c = 0; c < C; ++c) s[r][c] = _mm512_dpbusd_epi32(s[r][c], a, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r * ldacc + c] = horizontal_sum(s[r][c]) - 128 * sum[c];
}

void kernel(int64_t kp, const int8_t* const* /*a*/, const uint8_t* const* au, int rows, const int8_t* const* w,
            const int32_t* sum, int cols, int32_t* acc, int64_t ldacc) {
  // Missing rows and channels repeat the last one (the driver's padding); computing them
  // costs less than a second loop shape, and only the wanted ones are read back.
  (void)rows;
  (void)cols;
  block<4, 4>(kp, au, w, sum, acc, ldacc);
}

}  // namespace

const Int8KernelFn kInt8Vnni = kernel;

}  // namespace loom::kernels::int8_detail
