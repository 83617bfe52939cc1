// Data parallelism with ZeRO stages 0-3 (docs/parallelism.md): every rank trains the whole
// model on its shard of each global batch, and the gradients are summed across ranks as
// they become final during backward.
//
// The flat gradient buffer is cut into units ("buckets", [parallel] bucket_mb): contiguous
// element ranges, formed from the end of the buffer because backward finishes the last
// parameters first. A unit's communication starts, asynchronously, the moment the model
// reports (through its block hook, loom/core/params.h) that every gradient in it is final, and
// only on the last micro-step of an accumulation. Each unit is split into `size` near-equal
// parts; rank r owns part r of every unit:
//   zero 0: all-reduce every unit; every rank updates every parameter.
//   zero 1: all-reduce; each rank keeps optimizer state for and updates its parts only,
//           then the parameters are all-gathered.
//   zero 2: reduce-scatter instead: each rank receives only its parts' summed gradients.
//   zero 3: also the parameters: each rank keeps only its parts (the f32 master shard).
//           Units do not cross model blocks; a block's units are all-gathered into the flat
//           parameter buffer when the model enters the block (forward and backward), the
//           next block's gather already in flight, and their pages are given back to the
//           OS when it leaves.
// What each rank then updates, with the optimizer, is OptimizerStep's (optimizer_step.h).
// Deterministic mode sums gradients exactly (parallel/exact_sum.h), so losses and weights
// are bitwise equal to one process accumulating the same micro-batches, for any world size.
//
// Thread-safety: one thread drives a DataParallel (the one running forward and backward);
// its communication runs on the communicator's progress thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/parallel/comm_span.h"
#include "loom/optim/optim.h"
#include "loom/core/params.h"

namespace loom::parallel {

namespace detail {
struct DataParallelImpl;  // src/parallel/data_parallel_impl.h
}

struct DataParallelConfig {
  int zero = 0;                     // ZeRO stage, 0..3
  double bucket_mb = 25;            // unit size in MiB of f32 gradients
  bool deterministic = false;       // exact, order-independent gradient sums
  DType grad_dtype = DType::kF32;   // gradients on the wire: f32 or bf16 (summed in f32)
  DType param_dtype = DType::kF32;  // ZeRO 3's parameter all-gather: f32 or bf16 (the model
                                    // then computes with bf16-rounded weights; masters stay f32)
};

// Communication of one optimizer step, on this rank.
struct CommStats {
  double comm_ms = 0;     // time the progress thread spent in this step's collectives
  double exposed_ms = 0;  // time the training thread spent waiting for them
  int64_t bytes = 0;      // payload bytes of the collectives this rank issued
};

// Bytes of model state this rank holds (what ZeRO divides).
struct StateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

// Model parallelism (docs/parallelism.md, "Pipeline parallelism", "Tensor parallelism"):
// this rank holds one stage's parameters, or one tensor-parallel piece of them. The
// gradient norm is of the whole model, so this rank's squares are summed over `stages`
// (the ranks holding the other stages and pieces), leaving out the flat ranges in `skip`
// (sorted, disjoint: what another rank of that group counts: the last stage's copy of the
// tied embedding, and on every tensor-parallel piece but the first the replicated
// parameters); the tied parameter's gradients [tied_begin, tied_end) are summed over
// `tied` (the first and the last stage) by sum_tied_gradients().
struct StageGroups {
  comm::Communicator* stages = nullptr;
  comm::Communicator* tied = nullptr;
  int64_t tied_begin = 0, tied_end = 0;
  std::vector<std::pair<int64_t, int64_t>> skip;
};

class DataParallel {
 public:
  // block_offsets: the model's blocks (block b owns [block_offsets[b], block_offsets[b+1]),
  // see loom/core/params.h); a model without blocks passes {0, params.numel()}. The model's
  // block hook must call on_block. REQUIRES: params allocated, f32; comm outlives this.
  DataParallel(comm::Communicator& comm, ParamSet& params, const DataParallelConfig& config,
               std::vector<int64_t> block_offsets);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const;
  int size() const;
  ParamSet& params() const;

  // Broadcasts rank 0's parameters, then checks that every rank holds the same bits
  // (a fingerprint compare); ZeRO 3 then keeps only this rank's parts. Collective.
  void sync_params();

  // One optimizer step: begin_step(); per micro-step begin_micro_step(last), forward and
  // backward (whose block hook calls on_block), end_micro_step(); then finish_sums() and
  // the update (OptimizerStep::step, which ends with after_update()).
  // A pipeline stage's micro-steps are its backward pieces: the last piece of each chunk (a
  // range of blocks) is `last`, and its end_micro_step(from_block) says that the gradients
  // from that block up are final (-1: all of them, the embeddings too), so that their sums
  // start while the other stages still compute; the rest start at the last micro-step of
  // the step (after sum_tied_gradients). A unit's sum starts once per step.
  void begin_step();
  void begin_micro_step(bool last);
  void on_block(int block, BlockPhase phase);
  void end_micro_step(int from_block = -1);
  // Pipeline stages: set once, before the first step. The groups must outlive this.
  void set_stage_groups(const StageGroups& groups);
  // Sums the tied parameter's gradients over StageGroups::tied (exactly, in deterministic
  // mode). Collective over that group; after the last backward, before the last
  // micro-step's end_micro_step(). Until then no unit holding any of them starts its sum.
  void sum_tied_gradients();

  // Waits for the gradient sums and gives back what the ZeRO stage keeps no more (ZeRO 2-3:
  // the full gradient buffer's pages; ZeRO 3: every gathered block). Returns this rank's
  // summed gradients, what its update reads: the whole buffer (ZeRO 0-1) or its parts in
  // order (2-3). Valid until the next begin_step().
  Tensor finish_sums();
  // What this rank updates: its flat ranges, and where their values, gradients and state
  // live (for the optimizer, built once over it).
  optim::UpdateSpec update_spec() const;
  // After the update: the updated parameters to every rank that needs them (ZeRO 1-2
  // all-gather them; ZeRO 3 gathers each block when it is next used). Collective.
  void after_update();

  // The gradient norm's parts (OptimizerStep). Whether this rank's summed gradients are its
  // parts only (ZeRO 2-3: the squares are then summed over the replicas).
  bool sums_sharded() const;
  // Calls fn(pointer, count) over this rank's summed gradients, leaving out the flat ranges
  // another rank of the stage groups counts (StageGroups::skip).
  void for_each_counted(const std::function<void(const float*, int64_t)>& fn) const;
  // Deterministic mode: whether this step met a gradient the exact sums cannot hold.
  bool unsummable() const;
  // Sums over the replicas (the step's communication figures count them). Collective.
  void sum_over_replicas(int64_t* data, size_t count, const char* what);
  void sum_over_replicas(double* data, size_t count, const char* what);
  const StageGroups& stage_groups() const;
  bool deterministic() const;
  // Whether the gradients lie in memory this group's same-host ranks read in place
  // (ZeRO 0-1 with f32 gradients, not deterministic, units of kSharedGradsMinBucketMb or
  // more, on a shared window).
  bool grads_shared() const;
  // Below this, units read in place lost to the window with just-written inputs
  // (docs/parallelism.md, "Gradients in shared memory").
  static constexpr double kSharedGradsMinBucketMb = 16;
  // Parameter-server workers (loom/parallel/param_server.h), in place of finish_step: waits for the
  // gradient sums over the group and hands them over without updating anything. In
  // deterministic mode the exact sums (kLimbs int64 per element, parallel/exact_sum.h) and
  // whether a gradient was too large or not finite for them; else the f32 gradients.
  // REQUIRES: ZeRO 0. Valid until the next begin_step().
  struct Gradients {
    Tensor sums;
    bool unsummable = false;
  };
  Gradients finish_gradients();
  // After the update (OptimizerStep::step): the name of the parameter holding the first gradient element that is
  // not finite, in flat order over this group's ranks; "" when every one is finite.
  // Collective over the group (every rank gets the name).
  std::string first_nonfinite_gradient();

  // ZeRO 3: gathers every parameter into params.values(), where they stay, whatever the
  // block hook reports, until the next begin_step(): for evaluation, checkpoints and the
  // final model. Collective; does nothing at stages 0-2, which always hold them.
  void materialize_params();

  // The mean of every rank's micro-batch losses, summed in global micro-batch order (rank
  // r's micro-batches follow rank r-1's), so the result does not depend on the world size.
  double mean_loss(const std::vector<double>& micro_losses);

  CommStats take_stats();
  // Called on the training thread for every collective as it completes; empty: off.
  void set_comm_observer(std::function<void(const CommSpan&)> observer);
  // Resident bytes of parameters and gradients (between steps: what ZeRO promises; during
  // backward ZeRO 2-3 also hold the gradients not yet summed, and ZeRO 3 the gathered
  // blocks). The optimizer's are OptimizerStep's.
  StateBytes state_bytes() const;

  // The flat ranges this rank owns, ascending: its part of every unit. ZeRO 1-3 keep
  // optimizer state for these only; at ZeRO 0 the same split shares checkpoint writing
  // among the replicas.
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;
  // Where each owned range's optimizer state sits in a buffer over update_spec()'s
  // state_numel elements (ZeRO 1-3: its offset in the shard; ZeRO 0: its flat offset),
  // in the order of owned_ranges().
  std::vector<int64_t> owned_state_offsets() const;
  // Whether the optimizer state is this rank's parts only (ZeRO 1-3).
  bool shards_state() const;
  // Collective: `full` (the whole layout) from every rank's `own` (over update_spec()'s
  // state elements, this rank's parts in order).
  void gather_parts(const Tensor& full, const Tensor& own, const char* what);
  // This rank's parameters over owned_ranges(): views of its masters (ZeRO 3: its shard, so
  // that a checkpoint is written without gathering the model), valid until the next step.
  std::vector<Tensor> owned_values() const;
  // ZeRO 3: gives back the blocks a forward outside a step (an evaluation) gathered through
  // the block hook. Nothing at stages 0-2, or after materialize_params().
  void release_gathered();

 private:
  using Impl = detail::DataParallelImpl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::parallel
