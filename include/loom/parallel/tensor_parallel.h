// Tensor parallelism (Megatron-style, docs/parallelism.md "Tensor parallelism"): the seam
// of loom/nn/shard.h over a communicator of the tensor-parallel ranks, so that a GPT built
// with nn::Shard{rank, size, &seam} splits its attention heads and MLP across them.
//
// Thread-safety: one thread uses a seam (the one driving the model).
#pragma once

#include <chrono>
#include <functional>
#include <utility>

#include "loom/comm/comm.h"
#include "loom/parallel/comm_span.h"
#include "loom/nn/shard.h"

namespace loom::parallel {

class TensorParallelSeam : public nn::Seam {
 public:
  // Unattached: a model can be built (and its input checked) before the job's communicators
  // exist; attach() before the first forward.
  TensorParallelSeam() = default;
  explicit TensorParallelSeam(comm::Communicator& tp) : tp_(&tp) {}
  void attach(comm::Communicator& tp) { tp_ = &tp; }
  // All-reduces over the tensor-parallel group (f32 or f64), in place.
  void sum(const Tensor& t) override { reduce(t, comm::ReduceOp::kSum, "tp all-reduce"); }
  void max(const Tensor& t) override { reduce(t, comm::ReduceOp::kMax, "tp all-reduce max"); }
  // On the communicator's progress thread while the caller computes.
  std::unique_ptr<Pending> start_sum(const Tensor& t) override;
  void all_gather(const Tensor& local, const Tensor& whole) override;
  void reduce_scatter(const Tensor& whole, const Tensor& local) override;

  // The seam's collectives since the last take_stats(): how many, their payload bytes, the
  // time they took (issued to done) and the part of it this thread waited for them
  // (exposed: all of a blocking one; of an async one, what the caller's compute did not hide).
  struct Stats {
    int64_t calls = 0, bytes = 0;
    double ms = 0, exposed_ms = 0;
  };
  Stats take_stats() { return std::exchange(stats_, {}); }
  // Called for every collective as it completes (the training thread ran and waited for all
  // of it); empty: off. For traces.
  void set_observer(std::function<void(const CommSpan&)> observer) { observer_ = std::move(observer); }
  nn::Shard shard() {
    LOOM_CHECK(tp_ != nullptr);
    return {.index = tp_->rank(), .parts = tp_->size(), .seam = this};
  }

 private:
  class Async;
  void reduce(const Tensor& t, comm::ReduceOp op, const char* what);
  // One all-reduce, issued by this thread at `issued` (its time counts from there to when
  // this thread had the result).
  void record(const CommSpan& span, std::chrono::steady_clock::time_point issued);

  comm::Communicator* tp_ = nullptr;
  Stats stats_;
  std::function<void(const CommSpan&)> observer_;
};

}  // namespace loom::parallel
