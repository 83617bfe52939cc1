// Where a training step's time goes, by kind of work (`loom bench train --breakdown`): the
// linear layers' products (with the epilogues fused into them: bias, GELU, residual; in
// backward, the input gradients' and the weight gradients' apart), the attention's heads,
// the LayerNorms, a GELU that runs on its own, the embedding, head and loss, and the
// optimizer, each forward and backward. Its use is to see which part stops scaling as
// threads are added (issue 42, item 4), on machines without a profiler: each part's wall
// time, and the process's CPU time over the same spans (how busy the part kept the pool).
//
// The layers open a StepPartScope around their work. Recording is per thread and off until
// that thread turns it on, so a scope costs a thread-local read where nobody asked. Each
// part is charged its own time only: a scope opened inside another pauses the outer one's
// clock until it closes (Linear::forward_gelu calling Linear::forward is counted once), so
// the parts add up to at most the step, and what is left is the caller's (residual adds,
// copies, gradient zeroing). A traced step (`[profile] trace_steps`) also gets each scope as
// a span inside its block's (observe_step_parts; parallel/step_tracer.h).
#pragma once

#include <array>
#include <chrono>
#include <functional>

namespace loom::nn {

enum class StepPart : int {
  kLinearForward,
  kLinearDataGrad,    // the products of the layers' input gradients (with GELU's derivative fused)
  kLinearWeightGrad,  // of their weight and bias gradients
  kAttentionForward,
  kAttentionBackward,
  kNormForward,
  kNormBackward,
  kGeluForward,
  kGeluBackward,
  kEdgesForward,  // the embedding, the head and the loss
  kEdgesBackward,
  kOptimizer,
  kCount,
};
constexpr int kStepParts = static_cast<int>(StepPart::kCount);

// "linear_fwd", "attn_bwd", "optimizer", ...: the column names of `loom bench train --breakdown`.
const char* step_part_name(StepPart part);

// Turns recording on the calling thread on or off; either way the seconds kept are zeroed.
void record_step_parts(bool on);
// The seconds each part took on the calling thread since recording began or since the last
// take, zeroed. Call it between scopes, never inside one.
std::array<double, kStepParts> take_step_parts();
// The process's CPU seconds (every thread's: the part's OpenMP pool at work, or spinning
// while it waits, as OMP_WAIT_POLICY decides) over the same spans, taken and zeroed the same
// way: a part's CPU seconds over its wall seconds x threads is how busy the pool kept.
std::array<double, kStepParts> take_step_parts_cpu();

// Calls `observer` on the calling thread with each scope's part, start and end as it closes
// (inclusive: the scopes inside it included), until it is set to an empty function.
using StepPartObserver =
    std::function<void(StepPart, std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>;
void observe_step_parts(StepPartObserver observer);

// Charges the time until it is destroyed to `part` (its own time only: see above).
class StepPartScope {
 public:
  explicit StepPartScope(StepPart part);
  ~StepPartScope();
  StepPartScope(const StepPartScope&) = delete;
  StepPartScope& operator=(const StepPartScope&) = delete;

 private:
  StepPart part_;
  bool recorded_ = false, observed_ = false;
  int outer_ = -1;  // the part this scope paused (-1: none)
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace loom::nn
