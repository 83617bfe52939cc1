#include "comm/copy.h"

#include <emmintrin.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace loom::comm {
namespace {

// Below this glibc copies with vector moves, not `rep movsb`, at any placement.
constexpr size_t kRepMovsbBytes = 2048;

// From this size on glibc stops using `rep movsb` (its rep_movsb_stop_threshold): on AMD CPUs
// the L2 cache's size (512 KiB on Zen 3; from there its memmove is a vector loop, 29-34 GB/s
// at the slow placement below, where ours made 18-30), elsewhere its non-temporal threshold
// (hundreds of MiB).
size_t rep_movsb_stop() {
  static const size_t stop = [] {
    if (!__builtin_cpu_is("amd")) return SIZE_MAX;
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{512} << 10;
  }();
  return stop;
}

// Whether dst lies 1-63 bytes past src modulo a page: the placement glibc's `rep movsb`
// copies slowly on Zen 3 (measured there: 1.9-2.0 GB/s at 1-16 bytes, 20 at 48-63, 31-44
// elsewhere, for 256 KiB).
bool slow_placement(const char* dst, const char* src) {
  const uintptr_t ahead = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return ahead != 0 && ahead < 64;
}

template <bool kStream>
void store16(char* p, __m128i v) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
}

// 64 bytes a step, the stores aligned to a cache line (unaligned ones split every other
// store across two lines: 18-21 GB/s against 23-28 at 256 KiB to 4 MiB on Zen 3), ordinary
// or streaming; streaming ones are fenced before the tail, so the copy is ordered before any
// later store.
template <bool kStream>
void copy_lines(char* dst, const char* src, size_t n) {
  const size_t head = std::min(n, static_cast<size_t>(-reinterpret_cast<uintptr_t>(dst) & 63));
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {  // the whole line loaded, then stored
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * k));
    for (int k = 0; k < 4; ++k) store16<kStream>(dst + i + 16 * k, v[k]);
  }
  if constexpr (kStream) _mm_sfence();
  std::memcpy(dst + i, src + i, n - i);
}

// 64 bytes a step, a's stores aligned to a cache line.
template <bool kStreamA, bool kStreamB>
void tee_lines(char* a, char* b, const char* src, size_t n) {
  const size_t head = std::min(n, static_cast<size_t>(-reinterpret_cast<uintptr_t>(a) & 63));
  std::memcpy(a, src, head);
  std::memcpy(b, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + k));
      store16<kStreamA>(a + i + k, v);
      store16<kStreamB>(b + i + k, v);
    }
  }
  if constexpr (kStreamA || kStreamB) _mm_sfence();  // weakly ordered: done before any later publish
  std::memcpy(a + i, src + i, n - i);
  std::memcpy(b + i, src + i, n - i);
}

}  // namespace

void tee_copy(void* a_, void* b_, const void* src_, size_t n, bool stream_a, bool stream_b) {
  if (n == 0) return;
  char* a = static_cast<char*>(a_);
  char* b = static_cast<char*>(b_);
  const char* src = static_cast<const char*>(src_);
  stream_b = stream_b && ((reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a)) & 15) == 0;
  if (stream_a) {
    stream_b ? tee_lines<true, true>(a, b, src, n) : tee_lines<true, false>(a, b, src, n);
  } else {
    stream_b ? tee_lines<false, true>(a, b, src, n) : tee_lines<false, false>(a, b, src, n);
  }
}

void stream_copy(void* dst, const void* src, size_t n) {
  if (n == 0) return;
  copy_lines<true>(static_cast<char*>(dst), static_cast<const char*>(src), n);
}

void copy_bytes(void* dst_, const void* src_, size_t n) {
  if (n == 0) return;
  char* dst = static_cast<char*>(dst_);
  const char* src = static_cast<const char*>(src_);
  const bool apart = dst + n <= src || src + n <= dst;
  if (n >= kRepMovsbBytes && n < rep_movsb_stop() && apart && slow_placement(dst, src)) {
    copy_lines<false>(dst, src, n);
  } else {
    std::memmove(dst, src, n);
  }
}

}  // namespace loom::comm
