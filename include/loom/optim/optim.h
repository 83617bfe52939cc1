// Optimizers (AdamW, SGD with momentum), learning-rate schedules and global gradient-norm
// clipping, all over a model's flat ParamSet buffers.
//
// Optimizer state lives in flat buffers of the parameters' layout (one per role: AdamW's
// exp_avg and exp_avg_sq, SGD's momentum), so a checkpoint saves them per parameter name
// and ZeRO can shard them as ranges.
// Thread-safety: one thread drives an optimizer; kernels parallelize internally.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/core/params.h"

namespace loom::optim {

// Which parameters get weight decay. PyTorch practice (and nanoGPT's): weights of matmuls
// decay; biases, LayerNorm parameters and embeddings do not unless configured.
struct DecayPolicy {
  bool decay_embeddings = false;
  bool decay_norms_and_biases = false;
  bool decays(ParamKind kind) const;
};

struct OptimizerConfig {
  std::string kind = "adamw";  // "adamw" | "sgd"
  double weight_decay = 0.1;
  double beta1 = 0.9;   // AdamW
  double beta2 = 0.95;  // AdamW
  double eps = 1e-8;    // AdamW
  double momentum = 0.9;  // SGD
  DecayPolicy decay;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter from the gradients, at learning rate lr.
  virtual void step(double lr) = 0;
  // Named state buffers (each UpdateSpec::state_numel elements: for make_optimizer(config,
  // params), the flat layout of the parameters), for checkpoints.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

// Optimizer state in the flat layout of all parameters, by role ("exp_avg", ...), with the
// step count: what checkpoints hold, whatever layout (e.g. ZeRO shards) trained.
struct FlatState {
  std::vector<std::pair<std::string, Tensor>> buffers;
  int64_t steps = 0;
};

// Optimizer state over some ranges of that flat layout (ascending, disjoint [begin, end)),
// by role: one contiguous tensor of each range's elements per range, in the same order.
// What one ZeRO rank keeps; all of it is the single range [0, numel).
struct RangeState {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::pair<std::string, std::vector<Tensor>>> buffers;
  int64_t steps = 0;
};

// What an optimizer updates: pieces of parameters (all of them, or a ZeRO shard). Segment
// s updates values[value_offset, +numel) from grads[grad_offset, +numel), with its state at
// [state_offset, +numel) of buffers of state_numel elements. Offsets are in elements.
struct Segment {
  ParamKind kind;
  int64_t numel;
  int64_t value_offset, grad_offset, state_offset;
};
struct UpdateSpec {
  Tensor values, grads;  // flat, the parameters' dtype
  std::vector<Segment> segments;
  int64_t state_numel = 0;
};
// Every parameter of `params` whole: state in the flat layout of the parameters.
UpdateSpec whole(const ParamSet& params);

// REQUIRES: params allocated. Throws InputError for an unknown kind.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSet& params);
// Updates only `spec`'s segments; state() buffers have spec.state_numel elements.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, UpdateSpec spec);

struct ScheduleConfig {
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::string decay = "cosine";  // "cosine" | "linear" | "constant"
};

// Learning rate for 0-based step: linear warmup lr * (step + 1) / warmup_steps, then
// cosine or linear decay from lr to min_lr at total_steps - 1 (constant afterwards).
double lr_at(const ScheduleConfig& s, int64_t step);

// The L2 norm of all gradients (summed in double, in a fixed order). When max_norm > 0 and
// the norm exceeds it, scales every gradient by max_norm / (norm + 1e-6), as PyTorch's
// clip_grad_norm_. Returns the norm before clipping.
double clip_grad_norm(const ParamSet& params, double max_norm);

}  // namespace loom::optim
