// The AVX2 kernel of the int8 product (int8_matmul.h), on the same tiles as VNNI's (4 inputs'
// weights of 16 channels in 64 bytes). A row's 4 input values, widened to int16 and repeated,
// meet 4 channels' 4 weights widened alike; vpmaddwd multiplies them and adds pairs, so each
// int32 lane holds half of one channel's sum (exact integers: no int16 saturation, unlike
// vpmaddubsw). The halves are added at the end, once per output. Compiled for AVX2 whatever
// the build targets; called only after CPUID says the CPU has it.
#include <immintrin.h>

#include <cstring>

#include "kernels/int8_matmul.h"

namespace loom::kernels::int8_detail {
namespace {

// Four 4-channel vectors of half sums (channels 0-3, 4-7, 8-11, 12-15) -> 16 sums.
void store_group(const __m256i (&s)[4], int32_t* out) {
  for (int h = 0; h < 2; ++h) {
    // hadd gives channels 0 1 4 5 | 2 3 6 7 of the pair; the permute puts them in order.
    const __m256i sums = _mm256_hadd_epi32(s[2 * h], s[2 * h + 1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * h), _mm256_permute4x64_epi64(sums, 0xD8));
  }
}

// R rows (1 or 2: 4R sums, 4 weight vectors and a row's input fill 13 of AVX2's 16 registers)
// of 16 channels (w: their bytes in step 0).
template <int R>
void tile(int64_t kp, const int8_t* a, int64_t lda, const int8_t* w, int32_t* acc, int64_t ldacc) {
  __m256i s[R][4];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 4; ++q) s[r][q] = _mm256_setzero_si256();
  for (int64_t p = 0; p < kp; p += 4) {
    __m256i wv[4];
    for (int q = 0; q < 4; ++q)
      wv[q] = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(w + p * kInt8Tile + 16 * q)));
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * lda + p, 4);
      const __m256i av = _mm256_cvtepi8_epi16(_mm_set1_epi32(four));
      for (int q = 0; q < 4; ++q) s[r][q] = _mm256_add_epi32(s[r][q], _mm256_madd_epi16(av, wv[q]));
    }
  }
  for (int r = 0; r < R; ++r) store_group(s[r], acc + r * ldacc);
}

void kernel(int64_t kp, const int8_t* a, const uint8_t* /*au*/, int64_t lda, int rows, const int8_t* w,
            const int32_t* /*sum*/, const Int8Out& to) {
  constexpr int64_t ldacc = kInt8Tile;
  int32_t acc[kInt8MaxRows * ldacc];
  for (int g = 0; g < 4; ++g) {  // the tile's 4 sets of 16 channels
    int r = 0;
    for (; r + 2 <= rows; r += 2) tile<2>(kp, a + r * lda, lda, w + 64 * g, acc + r * ldacc + 16 * g, ldacc);
    if (r < rows) tile<1>(kp, a + r * lda, lda, w + 64 * g, acc + r * ldacc + 16 * g, ldacc);
  }
  finish_rows(acc, ldacc, rows, to);
}

}  // namespace

const Int8KernelFn kInt8Avx2 = kernel;

}  // namespace loom::kernels::int8_detail
