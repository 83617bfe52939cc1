// Examples: a dataset cut into what a model learns from one at a time, and batches of them
// as tensors (DESIGN.md section 4): windows of a token file (GPT) or labelled images (MLP).
// The trainer orders examples with data::Sampler (loom/data/data.h) and asks for batches by
// index; evaluation reads them in file order.
// Thread-safety: const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/data/data.h"
#include "loom/core/tensor.h"

namespace loom::data {

// A micro-batch: inputs and targets, (B, T) i32 tokens and next tokens, or (B, pixels) f32
// images and (B) i32 labels.
struct Batch {
  Tensor inputs, targets;
};

class Examples {
 public:
  virtual ~Examples() = default;
  virtual int64_t size() const = 0;  // examples
  virtual int64_t tokens_per_example() const = 0;  // what a throughput figure counts (1 for an image)
  // REQUIRES: every item in [0, size()).
  virtual Batch batch(std::span<const int64_t> items) const = 0;
  // How a Sampler should permute them.
  virtual Order order() const { return Order::kPermutation; }
};

// Window w of a token file: inputs tokens[wT, wT + T), targets tokens[wT + 1, wT + T + 1), as
// llm.c's loader; every full window, (count - 1) / T of them.
class TokenWindows : public Examples {
 public:
  TokenWindows(std::vector<uint16_t> tokens, int64_t t) : tokens_(std::move(tokens)), t_(t) {}
  int64_t size() const override { return tokens_.empty() ? 0 : (static_cast<int64_t>(tokens_.size()) - 1) / t_; }
  int64_t tokens_per_example() const override { return t_; }
  Batch batch(std::span<const int64_t> windows) const override;
  const std::vector<uint16_t>& tokens() const { return tokens_; }

 private:
  std::vector<uint16_t> tokens_;
  int64_t t_;
};

class ImageExamples : public Examples {
 public:
  explicit ImageExamples(ImageSet images) : images_(std::move(images)) {}
  int64_t size() const override { return images_.n; }
  int64_t tokens_per_example() const override { return 1; }
  Batch batch(std::span<const int64_t> items) const override;
  const ImageSet& images() const { return images_; }

 private:
  ImageSet images_;
};

}  // namespace loom::data
