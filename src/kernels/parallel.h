// When the small kernels use the OpenMP pool. Decoding a few tokens calls them on 1-16
// rows: forking and joining the pool for that costs more than the work, and even a
// parallel construct of one thread costs about a microsecond (docs/numerics.md, "Threads").
// The split never changes a result: every kernel that uses this computes each index alone.
#pragma once

#include <omp.h>

#include <cstdint>

namespace loom::kernels {

// Below this many elements of work a kernel runs on its caller's thread.
inline constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// body(i) for i in [0, n): on the pool (static schedule) when `elements` (the work, in
// elements) is at least kParallelMinElements and the caller is in no parallel region;
// otherwise in a plain loop on the caller's thread.
template <typename F>
void parallel_for(int64_t n, int64_t elements, F&& body) {
  if (elements < kParallelMinElements || omp_get_level() > 0 || omp_get_max_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// body(lo, hi) over [0, n) in chunks of `grain` elements, as parallel_for decides: for
// elementwise loops, which stay vectorized within a chunk.
template <typename F>
void parallel_chunks(int64_t n, F&& body, int64_t grain = 4096) {
  parallel_for((n + grain - 1) / grain, n, [&](int64_t chunk) {
    const int64_t lo = chunk * grain;
    body(lo, lo + grain < n ? lo + grain : n);
  });
}

// body(c0, c1) over [0, cols) in one contiguous range of columns per thread (one range on
// the caller's thread where parallel_for would not fork): for sums down the columns of a
// (rows, cols) matrix, each range read row after row along it (strips a few columns wide
// read rows kilobytes apart), each column's chain over the rows in order whatever the
// thread count.
template <typename F>
void column_ranges(int64_t rows, int64_t cols, F&& body) {
  const int64_t elements = rows * cols;
  const int64_t threads = elements >= kParallelMinElements && omp_get_level() == 0 ? omp_get_max_threads() : 1;
  const int64_t part = (cols + threads - 1) / threads;
  if (part == 0) return;
  parallel_for((cols + part - 1) / part, elements,
               [&](int64_t r) { body(r * part, r * part + part < cols ? r * part + part : cols); });
}

}  // namespace loom::kernels
