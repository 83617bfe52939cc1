#include "loom/tensor_parallel.h"

#include <chrono>

namespace loom::parallel {

void TensorParallelSeam::sum(const Tensor& t) {
  LOOM_CHECK(tp_ != nullptr && (t.dtype() == DType::kF32 || t.dtype() == DType::kF64));
  const auto begin = std::chrono::steady_clock::now();
  comm::all_reduce(*tp_, {.output = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = t.dtype()});
  const auto end = std::chrono::steady_clock::now();
  stats_.ms += std::chrono::duration<double, std::milli>(end - begin).count();
  if (observer_)
    observer_({.what = "tp all-reduce", .bytes = static_cast<int64_t>(t.nbytes()), .begin = begin, .end = end,
               .wait_begin = begin, .wait_end = end});
  stats_.bytes += static_cast<int64_t>(t.nbytes());
  ++stats_.calls;
}

}  // namespace loom::parallel
