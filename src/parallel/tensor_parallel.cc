#include "loom/tensor_parallel.h"

#include <chrono>

namespace loom::parallel {

void TensorParallelSeam::reduce(const Tensor& t, comm::ReduceOp op, const char* what) {
  LOOM_CHECK(tp_ != nullptr && (t.dtype() == DType::kF32 || t.dtype() == DType::kF64));
  const auto begin = std::chrono::steady_clock::now();
  comm::all_reduce(*tp_, {.output = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = t.dtype(), .op = op});
  const auto end = std::chrono::steady_clock::now();
  stats_.ms += std::chrono::duration<double, std::milli>(end - begin).count();
  if (observer_)
    observer_({.what = what, .bytes = static_cast<int64_t>(t.nbytes()), .begin = begin, .end = end,
               .wait_begin = begin, .wait_end = end});
  stats_.bytes += static_cast<int64_t>(t.nbytes());
  ++stats_.calls;
}

}  // namespace loom::parallel
