// The update that ends a training step, owned by the step's owner (Parallelized): the
// optimizer over what this rank updates (DataParallel::update_spec: everything at ZeRO 0,
// its parts at 1-3), fp16's loss scale taken out of the gradients, the global gradient norm
// over the replicas and the pipeline and tensor-parallel stage groups, clipping, and the
// updated parameters back to every rank that needs them (DataParallel::after_update). The
// optimizer's state for checkpoints is read and loaded here too.
//
// Thread-safety: the training thread's, as its DataParallel.
#pragma once

#include <memory>

#include "loom/optim/optim.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

class OptimizerStep {
 public:
  // The optimizer `config` over dp.update_spec(). `dp` outlives this.
  OptimizerStep(DataParallel& dp, const optim::OptimizerConfig& config);
  ~OptimizerStep();
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  // After the last micro-step's end_micro_step(): waits for the gradient sums, divides them
  // by loss_scale (fp16's dynamic loss scaling, loom/optim/loss_scale.h: a power of two, so
  // exactly), clips them to max_norm (0: no clipping), updates the parameters at lr and
  // hands them back (DataParallel::after_update). Returns the global gradient norm before
  // clipping. A norm that is not finite (an overflow) leaves the parameters and the
  // optimizer state as they were (no update, the step not counted). Collective.
  double step(double lr, double max_norm, double loss_scale = 1);

  int64_t steps() const;
  void set_steps(int64_t steps);
  int64_t state_bytes() const;  // resident bytes of the optimizer's state
  // Collective: every rank gets the full-layout optimizer state.
  optim::FlatState gather_state();
  // This rank's optimizer state over dp.owned_ranges(): views into the optimizer's own
  // buffers. Valid until the next step.
  optim::RangeState owned_state() const;
  // Views of all the optimizer state this rank keeps (ZeRO 0: the whole layout; else
  // owned_ranges()), to load a checkpoint into in place; then set_steps.
  optim::RangeState kept_state() const;

 private:
  // The global norm of the summed gradients `g`, and clipped to max_norm.
  double norm_and_clip(const Tensor& g, double max_norm);

  DataParallel& dp_;
  ParamSet& params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace loom::parallel
