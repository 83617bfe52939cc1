#include "kernels/embedding.h"

#include <omp.h>

#include <algorithm>

#include "kernels/parallel.h"

namespace loom::kernels {

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t c) {
  parallel_for(n, n * c, [&](int64_t i) {
    if (ids[i] < 0) std::fill_n(out + i * c, c, T(0));
    else std::copy(table + ids[i] * c, table + (ids[i] + 1) * c, out + i * c);
  });
}

template <typename T>
void embedding_backward(T* dtable, const int32_t* ids, const T* dout, int64_t n, int64_t c) {
  // Channels split across threads so two rows with the same id never race; each thread
  // adds rows in order, so the result does not depend on the thread count. Strips of 64
  // channels, or narrower (16: a cache line of floats) where that leaves threads idle:
  // gpt-mini's 256 channels were 4 strips for 16 threads.
  const int64_t threads = omp_get_max_threads();
  const int64_t cols = std::clamp<int64_t>(((c + threads - 1) / threads + 15) / 16 * 16, 16, 64);
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < c; c0 += cols) {
    int64_t c1 = std::min(c, c0 + cols);
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;
      T* dst = dtable + ids[i] * c;
      const T* src = dout + i * c;
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t);
template void embedding_backward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_backward<double>(double*, const int32_t*, const double*, int64_t,
                                         int64_t);

}  // namespace loom::kernels
