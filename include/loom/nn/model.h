// nn::Model: what every parallelism sees of a model (DESIGN.md section 3, "How parallelism
// meets the model"; docs/architecture.md). A model is a sequence of blocks with global ids
// [0, n_blocks()) between an embedding and a head; one process runs them all, a pipeline
// stage a range of them. Its parameters live in one flat ParamSet, grouped by block
// (block_offsets), and its forward and backward report entering and leaving each block to a
// list of hooks (data parallelism's bucketed all-reduce, ZeRO-3's gathers, traces).
//
// Gpt (loom/nn/gpt.h) and MlpClassifier (loom/nn/mlp.h) implement it.
// Thread-safety: one thread drives a model; kernels parallelize internally.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/nn/layers.h"
#include "loom/core/params.h"

namespace loom::nn {

// Hooks called as a model's forward and backward enter and leave each block, in the order
// loom/core/params.h's BlockPhase describes. Each hook added is called, in the order added.
class BlockHooks {
 public:
  using Id = int;
  Id add(BlockHook hook);
  void remove(Id id);  // a hook no longer called; unknown ids are ignored
  void operator()(int block, BlockPhase phase) const {
    for (const auto& [id, hook] : hooks_) hook(block, phase);
  }
  bool empty() const { return hooks_.empty(); }

 private:
  std::vector<std::pair<Id, BlockHook>> hooks_;
  Id next_ = 0;
};

// What one micro-batch's forward keeps for its backward; each model has its own kind
// (GptCtx, MlpClassifierCtx), made by make_ctx.
struct ModelCtx {
  virtual ~ModelCtx() = default;
};

// A model's kind and shape, as checkpoints record them ("gpt": n_layer, n_head, d_model,
// seq_len, vocab_size; "mlp": inputs, hidden, n_hidden, classes), in that order.
struct ModelShape {
  std::string kind;
  std::vector<std::pair<std::string, int64_t>> fields;
};

// What evaluation adds up over a batch: the mean loss and, for a classifier, how many
// predictions were right (-1 for a model that does not classify).
struct EvalSums {
  double loss = 0;
  int64_t correct = -1;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual ModelShape shape() const = 0;
  virtual ParamSet& params() = 0;
  virtual const ParamSet& params() const = 0;
  virtual int64_t n_blocks() const = 0;
  // n_blocks() + 1 flat element offsets: block b's parameters are [offsets[b], offsets[b+1]);
  // the rest (embeddings, head) lies before offsets[0] and after offsets[n_blocks()]. A block
  // this process does not hold (another pipeline stage's) is the empty range where it would be.
  virtual std::vector<int64_t> block_offsets() const = 0;
  virtual bool holds_block(int64_t /*block*/) const { return true; }
  // Forward FLOPs of one example (a sequence of the model's window, an image); training
  // costs 3x this.
  virtual double forward_flops_per_example() const = 0;

  virtual std::unique_ptr<ModelCtx> make_ctx() const = 0;

  // The whole model in one process: inputs and targets of one micro-batch ((B, T) tokens,
  // or (B, features) and (B) labels). Returns the mean loss; backward accumulates the
  // gradients d(mean loss x scale)/dparams. REQUIRES: forward(ctx) before backward(ctx).
  virtual double forward(const Tensor& inputs, const Tensor& targets, ModelCtx& ctx) const = 0;
  virtual void backward(ModelCtx& ctx, double scale) const = 0;
  // Forward only, for validation: the mean loss and (classifiers) the right predictions.
  virtual EvalSums evaluate(const Tensor& inputs, const Tensor& targets, ModelCtx& ctx) const;

  // The same in pieces, each over what this process holds (a pipeline stage): forward is
  // begin, embed, forward_stage(0, n_blocks()), head; backward is backward_head,
  // backward_stage(0, n_blocks()), backward_embed, with the same bits. b examples of t
  // positions (1 for a model without a sequence). defer_weights (zero-bubble schedules):
  // the weight gradients of the linear layers wait for backward_weights; a model that cannot
  // defer computes them at once (the same sums).
  virtual void begin(ModelCtx& ctx, int64_t b, int64_t t) const = 0;
  virtual Shape activation_shape(int64_t b, int64_t t) const = 0;  // what each block gives and takes
  virtual Tensor embed(const Tensor& inputs, ModelCtx& ctx) const = 0;
  virtual Tensor forward_stage(int64_t lo, int64_t hi, const Tensor& x, ModelCtx& ctx) const = 0;
  virtual double head(const Tensor& x, const Tensor& targets, ModelCtx& ctx) const = 0;
  virtual Tensor backward_head(ModelCtx& ctx, double scale, bool defer_weights = false) const = 0;
  virtual Tensor backward_stage(int64_t lo, int64_t hi, const Tensor& dy, ModelCtx& ctx,
                                bool defer_weights = false) const = 0;
  virtual void backward_weights(int64_t lo, int64_t hi, bool head, const ModelCtx& ctx) const = 0;
  virtual void backward_embed(const Tensor& dx, ModelCtx& ctx) const = 0;
  // The loss's context in ctx, for what the loss mixes in (distillation's targets).
  virtual CrossEntropyCtx& loss_ctx(ModelCtx& ctx) const = 0;

  BlockHooks& hooks() { return hooks_; }

 protected:
  BlockHooks hooks_;
};

}  // namespace loom::nn
