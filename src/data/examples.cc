#include "loom/data/examples.h"

#include <algorithm>

namespace loom::data {

Batch TokenWindows::batch(std::span<const int64_t> windows) const {
  const auto b = static_cast<int64_t>(windows.size());
  Batch out{Tensor::zeros({b, t_}, DType::kI32), Tensor::zeros({b, t_}, DType::kI32)};
  int32_t* x = out.inputs.data<int32_t>();
  int32_t* y = out.targets.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const uint16_t* src = tokens_.data() + windows[static_cast<size_t>(i)] * t_;
    for (int64_t j = 0; j < t_; ++j) {
      x[i * t_ + j] = src[j];
      y[i * t_ + j] = src[j + 1];
    }
  }
  return out;
}

Batch ImageExamples::batch(std::span<const int64_t> items) const {
  const int64_t d = images_.rows * images_.cols, b = static_cast<int64_t>(items.size());
  Batch out{Tensor::zeros({b, d}, DType::kF32), Tensor::zeros({b}, DType::kI32)};
  for (int64_t i = 0; i < b; ++i) {
    const int64_t item = items[static_cast<size_t>(i)];
    std::copy_n(images_.pixels.data() + item * d, d, out.inputs.data<float>() + i * d);
    out.targets.data<int32_t>()[i] = images_.labels[static_cast<size_t>(item)];
  }
  return out;
}

}  // namespace loom::data
