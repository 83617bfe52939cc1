// The AVX-512 VNNI kernel of the int8 product (int8_matmul.h): vpdpbusd multiplies 64
// unsigned bytes by 64 signed bytes and adds each 4 adjacent products into 16 int32 lanes.
// With the weights in groups (Int8Weight: 4 inputs' weights of 16 channels in one 64-byte
// load) and a row's 4 input bytes broadcast, each instruction adds 4 products to each of 16
// channels' sums: no horizontal adds. The input is taken as q + 128 (unsigned), so each sum
// is sum((q + 128) w) and 128 x sum(w) comes off at the end: exact integers, the same as the
// other paths. Compiled for AVX-512 VNNI whatever the build targets; called only after CPUID
// says the CPU has it.
#include <immintrin.h>

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

// R rows x G groups: R x G sums in registers, G weight vectors a step.
template <int R, int G>
void tile(int64_t kp, const uint8_t* au, int64_t lda, const int8_t* w, const int32_t* sum, int32_t* acc,
          int64_t ldacc) {
  const int64_t stride = kp * kInt8Group;  // bytes a group
  __m512i s[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) s[r][g] = _mm512_setzero_si512();
  for (int64_t p = 0; p < kp; p += 4) {
    __m512i wv[G];
    for (int g = 0; g < G; ++g) wv[g] = _mm512_load_si512(w + g * stride + p * kInt8Group);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, au + r * lda + p, 4);
      const __m512i a = _mm512_set1_epi32(four);
      for (int g = 0; g < G; ++g) s[r][g] = dot(s[r][g], a, wv[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    // x 128 by a multiply: GCC 12's _mm512_slli_epi32 trips -Wuninitialized inside its header.
    const __m512i offset = _mm512_mullo_epi32(_mm512_loadu_si512(sum + g * kInt8Group), _mm512_set1_epi32(128));
    for (int r = 0; r < R; ++r) _mm512_storeu_si512(acc + r * ldacc + g * kInt8Group, _mm512_sub_epi32(s[r][g], offset));
  }
}

// R rows, any groups in [1, 4]: 4 groups a tile up to 4 rows, 2 past (16 sums in registers).
template <int R>
void rows_of(int64_t kp, const uint8_t* au, int64_t lda, const int8_t* w, const int32_t* sum, int groups, int32_t* acc,
             int64_t ldacc) {
  constexpr int kMax = R <= 4 ? 4 : 2;
  const int64_t stride = kp * kInt8Group;
  for (int g = 0; g < groups;) {
    const int left = groups - g;
    const int8_t* wg = w + g * stride;
    const int32_t* sg = sum + g * kInt8Group;
    int32_t* ag = acc + g * kInt8Group;
    if (left >= kMax) {
      tile<R, kMax>(kp, au, lda, wg, sg, ag, ldacc);
      g += kMax;
    } else if (left >= 2) {
      tile<R, 2>(kp, au, lda, wg, sg, ag, ldacc);
      g += 2;
    } else {
      tile<R, 1>(kp, au, lda, wg, sg, ag, ldacc);
      g += 1;
    }
  }
}

void kernel(int64_t kp, const int8_t* /*a*/, const uint8_t* au, int64_t lda, int rows, const int8_t* w,
            const int32_t* sum, int groups, int32_t* acc, int64_t ldacc) {
  switch (rows) {
    case 1: return rows_of<1>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 2: return rows_of<2>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 3: return rows_of<3>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 4: return rows_of<4>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 5: return rows_of<5>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 6: return rows_of<6>(kp, au, lda, w, sum, groups, acc, ldacc);
    case 7: return rows_of<7>(kp, au, lda, w, sum, groups, acc, ldacc);
    default: return rows_of<8>(kp, au, lda, w, sum, groups, acc, ldacc);
  }
}

}  // namespace

const Int8KernelFn kInt8Vnni = kernel;

}  // namespace loom::kernels::int8_detail
