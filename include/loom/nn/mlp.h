// MlpClassifier: an image classifier, input -> [Linear -> GELU] x n_hidden -> Linear ->
// softmax cross-entropy (e.g. 784-512-512-10 for Fashion-MNIST).
// Parameter names: fc0.weight (in, hidden), fc0.bias, ..., fcN.weight (hidden, classes).
// As an nn::Model (loom/nn/model.h) its blocks are the n_hidden + 1 Linear layers, each
// hidden one with the GELU after it; embed passes the images through and the head is the
// loss. Thread-safety: one thread drives a model; kernels parallelize internally.
#pragma once

#include <memory>
#include <vector>

#include "loom/nn/layers.h"
#include "loom/nn/model.h"

namespace loom::nn {

struct MlpConfig {
  int64_t inputs = 784;
  int64_t hidden = 512;
  int64_t n_hidden = 2;
  int64_t classes = 10;
};

struct MlpClassifierCtx : ModelCtx {
  Arena arena;
  std::vector<LinearCtx> fc;
  std::vector<GeluCtx> act;
  CrossEntropyCtx loss;
  Tensor logits;
};

class MlpClassifier : public Model {
 public:
  explicit MlpClassifier(const MlpConfig& config, DType dtype = DType::kF32);
  // Weights uniform(-1/sqrt(in), 1/sqrt(in)) as PyTorch's nn.Linear; biases likewise.
  void init(uint64_t seed);

  // (B, classes) for x (B, inputs) in the model dtype.
  Tensor forward_logits(const Tensor& x, MlpClassifierCtx& ctx) const;

  // nn::Model: inputs x (B, inputs), targets labels (B) i32 in [0, classes); the contexts are
  // MlpClassifierCtx; evaluate counts the rows whose largest logit is the label. Block -1 of
  // the hooks holds no parameters. What passes between two blocks is (B, hidden).
  ModelShape shape() const override;
  ParamSet& params() override { return params_; }
  const ParamSet& params() const override { return params_; }
  int64_t n_blocks() const override { return static_cast<int64_t>(fc_.size()); }
  std::vector<int64_t> block_offsets() const override;
  double forward_flops_per_example() const override { return 2.0 * static_cast<double>(params_.numel()); }
  std::unique_ptr<ModelCtx> make_ctx() const override { return std::make_unique<MlpClassifierCtx>(); }
  double forward(const Tensor& x, const Tensor& labels, ModelCtx& ctx) const override;
  void backward(ModelCtx& ctx, double scale) const override;
  EvalSums evaluate(const Tensor& x, const Tensor& labels, ModelCtx& ctx) const override;
  void begin(ModelCtx& ctx, int64_t b, int64_t t) const override;
  Shape activation_shape(int64_t b, int64_t /*t*/) const override { return {b, config_.hidden}; }
  Tensor embed(const Tensor& x, ModelCtx& /*ctx*/) const override { return x; }
  Tensor forward_stage(int64_t lo, int64_t hi, const Tensor& x, ModelCtx& ctx) const override;
  double head(const Tensor& logits, const Tensor& labels, ModelCtx& ctx) const override;
  Tensor backward_head(ModelCtx& ctx, double scale, bool defer_weights = false) const override;
  // Weight gradients are never deferred: backward_weights has nothing left to do.
  Tensor backward_stage(int64_t lo, int64_t hi, const Tensor& dy, ModelCtx& ctx,
                        bool defer_weights = false) const override;
  void backward_weights(int64_t, int64_t, bool, const ModelCtx&) const override {}
  void backward_embed(const Tensor&, ModelCtx&) const override {}
  CrossEntropyCtx& loss_ctx(ModelCtx& ctx) const override;

  const MlpConfig& config() const { return config_; }

 private:
  MlpConfig config_;
  ParamSet params_;
  std::vector<Linear> fc_;
};

}  // namespace loom::nn
