// The AVX2 kernel of the int8 product (int8_matmul.h): 16 int8 values at a time widened to
// int16, then vpmaddwd multiplies them in pairs and adds each pair into 8 int32 lanes: exact
// integers (no int16 saturation, unlike vpmaddubsw), the same as the other paths. Compiled
// for AVX2 whatever the build targets; called only after CPUID says the CPU has it.
#include <immintrin.h>

#include "kernels/int8_matmul.h"

namespace loom::kernels::int8_detail {
namespace {

int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

void kernel(int64_t kp, const int8_t* const* a, const uint8_t* const* /*au*/, int /*rows*/, const int8_t* const* w,
            const int32_t* /*sum*/, int /*cols*/, int32_t* acc, int64_t ldacc) {
  // Every call computes 4 x 4; missing rows and channels repeat the last (the driver's padding).
  constexpr int R = 4, C = 4;
  __m256i s[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r][c] = _mm256_setzero_si256();
  for (int64_t p = 0; p < kp; p += 16) {
    __m256i wv[C];
    for (int c = 0; c < C; ++c)
      wv[c] = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(w[c] + p)));
    for (int r = 0; r < R; ++r) {
      const __m256i av = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(a[r] + p)));
      for (int c = 0; c < C; ++c) s[r][c] = _mm256_add_epi32(s[r][c], _mm256_madd_epi16(av, wv[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r * ldacc + c] = horizontal_sum(s[r][c]);
}

}  // namespace

const Int8KernelFn kInt8Avx2 = kernel;

}  // namespace loom::kernels::int8_detail
