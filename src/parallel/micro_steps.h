// The micro-steps of a whole model's step (private to src/parallel): what the mesh's step
// runs without a pipeline and a parameter-server worker runs before its push.
#pragma once

#include <vector>

#include "loom/parallel/parallelize.h"

namespace loom::parallel {

// Forward and backward of micro-batches batch(0) ... batch(accum - 1) in `ctx`, backward on
// the loss times `scale`, each bracketed for `dp` (its sums start with the last one); the
// loss mixes in `targets` when set; a traced step's "micro-step m" spans go to `tracer`
// (null: off). Returns the micro-batches' losses.
std::vector<double> whole_model_micro_steps(nn::Model& model, nn::ModelCtx& ctx, DataParallel& dp, int64_t accum,
                                            const Parallelized::MicroBatches& batch, double scale,
                                            const LossTargets& targets, StepTracer* tracer);

}  // namespace loom::parallel
