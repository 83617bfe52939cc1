#include "loom/tensor_parallel.h"

namespace loom::parallel {

void TensorParallelSeam::sum(const Tensor& t) {
  LOOM_CHECK(tp_ != nullptr && (t.dtype() == DType::kF32 || t.dtype() == DType::kF64));
  comm::all_reduce(*tp_, {.output = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = t.dtype()});
}

}  // namespace loom::parallel
