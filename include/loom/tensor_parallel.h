// Tensor parallelism (Megatron-style, docs/parallelism.md "Tensor parallelism"): the seam
// of loom/nn/shard.h over a communicator of the tensor-parallel ranks, so that a GPT built
// with nn::Shard{rank, size, &seam} splits its attention heads and MLP across them.
//
// Thread-safety: one thread uses a seam (the one driving the model).
#pragma once

#include "loom/comm.h"
#include "loom/nn/shard.h"

namespace loom::parallel {

class TensorParallelSeam : public nn::Seam {
 public:
  // Unattached: a model can be built (and its input checked) before the job's communicators
  // exist; attach() before the first forward.
  TensorParallelSeam() = default;
  explicit TensorParallelSeam(comm::Communicator& tp) : tp_(&tp) {}
  void attach(comm::Communicator& tp) { tp_ = &tp; }
  // An all-reduce over the tensor-parallel group (f32 or f64), in place.
  void sum(const Tensor& t) override;
  nn::Shard shard() {
    LOOM_CHECK(tp_ != nullptr);
    return {.index = tp_->rank(), .parts = tp_->size(), .seam = this};
  }

 private:
  comm::Communicator* tp_ = nullptr;
};

}  // namespace loom::parallel
