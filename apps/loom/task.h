// A training task: a model plus the data it learns from. The training loop drives any task
// through this interface: micro-steps over sampled items, evaluation, and the numbers the
// metrics need. GPT learns next tokens from a token file; MLP classifies images.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include <nlohmann/json.hpp>

#include "loom/nn/gpt.h"
#include "loom/params.h"

namespace loom::app {

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // classification only
  int64_t items = 0;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual ParamSet& params() = 0;
  // Examples in the training set (windows or images); the sampler orders them.
  virtual int64_t train_items() const = 0;
  // Forward and backward over these items as one micro-batch; gradients of
  // (mean loss x scale) are accumulated. Returns the micro-batch's mean loss.
  virtual double micro_step(const std::vector<int64_t>& items, double scale) = 0;
  // Validation over at most max_items items (0: all), in file order; with `whole`, of that
  // model (a pipeline stage holds only its part; GPT only).
  virtual EvalResult evaluate(int64_t max_items, const nn::Gpt* whole = nullptr) = 0;
  virtual bool has_validation() const = 0;
  virtual int64_t tokens_per_item() const = 0;
  // Training FLOPs per item (forward + backward), for MFU.
  virtual double train_flops_per_item() const = 0;
  // Data parallelism (loom/data_parallel.h): the model reports entering and leaving each
  // block through `hook` (loom/params.h's BlockPhase), and block b owns the flat parameter
  // range [block_offsets()[b], block_offsets()[b+1]).
  virtual void set_block_hook(BlockHook hook) = 0;
  virtual std::vector<int64_t> block_offsets() const = 0;
  // The model's shape, saved in checkpoints so sample/eval can rebuild it.
  virtual nlohmann::json model_json() const = 0;
  // Pipeline parallelism: the GPT (this stage's part) and a micro-batch's (B, T) tokens and
  // targets; nullptr and InputError for other models.
  virtual nn::Gpt* gpt() { return nullptr; }
  virtual std::pair<Tensor, Tensor> batch(const std::vector<int64_t>& items) = 0;
  // Distillation ([training] teacher): whether this task has a teacher, and its targets for
  // a micro-batch's tokens put into `loss` (a pipeline's last stage calls it; micro_step
  // does it itself).
  virtual bool distilling() const { return false; }
  virtual void set_distill_targets(const Tensor& /*tokens*/, nn::CrossEntropyCtx& /*loss*/) {}
};

// Loads and validates the data (InputError naming the file) and builds the model, or the
// part of a GPT that `part` names (a pipeline stage), split over `tp` (its tensor-parallel
// piece; the serial model when tp.parts = 1). `init`: false leaves the weights zero, for a
// caller that loads every one of them (a resume), sparing the random initialization.
std::unique_ptr<Task> make_task(const Config& c, const nn::GptPart& part = {}, const nn::Shard& tp = {},
                                bool init = true);

nn::GptConfig gpt_config(const Config& c);
// Mean next-token loss over every full window of `tokens` (DESIGN.md section 4, loom eval).
EvalResult eval_windows(const nn::Gpt& gpt, const std::vector<uint16_t>& tokens, int64_t t,
                        int64_t batch, int64_t max_windows);
// Checks every token is below the vocabulary size; InputError naming the file otherwise.
void check_vocab(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path);

}  // namespace loom::app
