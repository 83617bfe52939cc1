#include "kernels/precision.h"

#include "kernels/parallel.h"
#include "loom/core/error.h"

namespace loom::kernels {

void round_to(DType format, float* x, int64_t n) {
  if (format != DType::kF32) round_copy(format, x, x, n);
}

void round_copy(DType format, float* out, const float* x, int64_t n) {
  LOOM_CHECK(format == DType::kF32 || format == DType::kBF16 || format == DType::kF16);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) { round_serial(format, out + lo, x + lo, hi - lo); });
}

void store_half(DType format, uint16_t* out, const float* x, int64_t n) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) { store_half_serial(format, out + lo, x + lo, hi - lo); });
}

void load_half(DType format, float* out, const uint16_t* in, int64_t n) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) { load_half_serial(format, out + lo, in + lo, hi - lo); });
}

}  // namespace loom::kernels
