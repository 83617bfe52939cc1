// MlpClassifier: an image classifier, input -> [Linear -> GELU] x n_hidden -> Linear ->
// softmax cross-entropy (e.g. 784-512-512-10 for Fashion-MNIST).
// Parameter names: fc0.weight (in, hidden), fc0.bias, ..., fcN.weight (hidden, classes).
// Thread-safety: one thread drives a model; kernels parallelize internally.
#pragma once

#include <vector>

#include "loom/nn/layers.h"

namespace loom::nn {

struct MlpConfig {
  int64_t inputs = 784;
  int64_t hidden = 512;
  int64_t n_hidden = 2;
  int64_t classes = 10;
};

struct MlpClassifierCtx {
  Arena arena;
  std::vector<LinearCtx> fc;
  std::vector<GeluCtx> act;
  CrossEntropyCtx loss;
  Tensor logits;
};

class MlpClassifier {
 public:
  explicit MlpClassifier(const MlpConfig& config, DType dtype = DType::kF32);
  // Weights uniform(-1/sqrt(in), 1/sqrt(in)) as PyTorch's nn.Linear; biases likewise.
  void init(uint64_t seed);

  // x (B, inputs) in the model dtype, labels (B) i32 in [0, classes). Returns mean loss.
  double forward(const Tensor& x, const Tensor& labels, MlpClassifierCtx& ctx) const;
  Tensor forward_logits(const Tensor& x, MlpClassifierCtx& ctx) const;  // (B, classes)
  void backward(MlpClassifierCtx& ctx, double scale) const;

  // Called as forward and backward enter and leave each Linear layer (a block), in the
  // order loom/params.h's BlockPhase describes; the rest (block -1) holds no parameters.
  BlockHook on_block;
  // n_hidden + 2 flat element offsets: layer i's parameters are [offsets[i], offsets[i+1]).
  std::vector<int64_t> block_offsets() const;

  const MlpConfig& config() const { return config_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }

 private:
  MlpConfig config_;
  ParamSet params_;
  std::vector<Linear> fc_;
};

}  // namespace loom::nn
