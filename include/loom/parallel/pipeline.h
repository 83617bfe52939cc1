// Pipeline parallelism (docs/parallelism.md, "Pipeline parallelism"): the executor
// that runs one stage's list of a Schedule (loom/parallel/schedule.h) against the stage's part of
// the model, moving activations and gradients between neighbouring stages with async
// sends and receives that overlap compute.
//
// Layout: the n_layer blocks are cut into p x v contiguous, equal ranges in virtual-stage
// order (chunk c of stage s is virtual stage c p + s); the first virtual stage also holds
// the embeddings, the last ln_f and the head. The head is tied to wte, so with p > 1 the
// last stage holds a copy of wte, whose gradients the caller adds to the first stage's
// (DataParallel::sum_tied_gradients).
//
// Every directed link (stage to stage, activations or gradients) is its own two-rank
// communicator, so a link's progress thread never waits behind another link's transfer.
//
// Thread-safety: one thread drives a Pipeline (the training thread).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/nn/gpt_config.h"
#include "loom/nn/model.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

// Blocks [first, second) of chunk `chunk` of stage `stage`. REQUIRES: n_layer % (p v) == 0.
std::pair<int64_t, int64_t> chunk_blocks(int64_t n_layer, int stages, int virtual_stages, int stage, int chunk);
// What stage `stage` holds of the model.
nn::GptPart stage_part(int64_t n_layer, int stages, int virtual_stages, int stage);

// Where one step's time went on this stage.
struct PipelineStats {
  double step_ms = 0;  // from the first action to the last
  double start_ms = 0;  // when the first action began: steady clock, ms since its epoch
  double busy_ms = 0;  // forward and backward compute
  double wait_ms = 0;  // waiting for a neighbour's activations or gradients (bubble and transfers)
  double send_ms = 0;  // this stage's sends, each from its start to its completion on the progress thread
  int64_t sent_bytes = 0;
  int peak_in_flight = 0;  // chunk contexts alive at once (activations held)
  // This stage's measured costs in the simulator's terms (per micro-batch, whole stage; the
  // transfer timed by bouncing a message of the activations' size over its links when the
  // size first appears), so that simulate() can predict the step the executor just ran.
  PipeCosts costs;
  // The same step action by action, in list order (PipeActionTimes' rows for this stage):
  // compute time, and the time that was neither compute nor a wait. The last action's
  // overhead includes draining the step's sends.
  std::vector<double> action_compute_ms, action_overhead_ms;
  // On the steady clock (ms since its epoch), per action: when its own work began (after
  // any wait for a neighbour; a send or receive: when it was posted), and for a receive,
  // when its message had landed (the receive completed on the progress thread), else 0.
  // What the simulator's replay takes each message's in-step transfer time from.
  std::vector<double> action_begin_ms, action_landed_ms;
};

// One span of a stage's step, for traces: a compute action ("forward mb 3 chunk 0") or a
// wait for a neighbour ("wait: activations of micro-batch 3 from stage 0 (rank 0)").
struct PipeSpan {
  std::string what;
  bool compute = true;
  std::chrono::steady_clock::time_point begin, end;
};

class Pipeline {
 public:
  // pp: the pipeline group, rank = stage. model holds stage_part(...) of this stage; the
  // schedule's stages equal pp.size(). stage_ranks: each stage's rank in the job, for
  // error messages (empty: stages only). Collective over pp (creates the links).
  Pipeline(comm::Communicator& pp, Schedule schedule, nn::Model& model, std::vector<int> stage_ranks = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The micro-batch's tokens and targets, (B, T) i32 each; called on the first and the last
  // stage for each micro-batch as it enters or leaves the pipeline.
  using Batch = std::function<std::pair<Tensor, Tensor>(int microbatch)>;

  // What brackets each backward piece: `begin` before it adds to the gradients, `end` after
  // (DataParallel's begin_micro_step / end_micro_step, so that deterministic mode sums each
  // piece exactly, and the replicas' sums of a chunk's gradients start as soon as they are
  // final). Either may be empty.
  struct Piece {
    // The last piece that adds to its chunk's gradients this step: after it, the gradients
    // of blocks from_block up on this stage are final (from_block -1: the first virtual
    // stage's, the embeddings' too). The model's block hooks report each block of it.
    bool final = false;
    int64_t from_block = -1;
  };
  struct BackwardPieces {
    std::function<void(const Piece&)> begin, end;
  };

  // Runs this stage's list for one optimizer step: gradients of (mean loss x scale) of every
  // micro-batch are accumulated into the model's gradients, each backward piece inside `pieces`.
  // The caller then finishes the step (the tied gradients, the sums over replicas, the
  // update). Returns the micro-batch losses on the last stage, empty elsewhere.
  // RuntimeError when a neighbour dies or stalls, naming this stage, the micro-batch, the
  // transfer and the neighbour's stage and rank.
  std::vector<double> run(const Batch& batch, int64_t b, int64_t t, double scale, const BackwardPieces& pieces);

  // Forward only (evaluation): one micro-batch of b examples of t positions (inputs read on
  // the first stage, targets on the last) through every virtual stage in turn, in the
  // context of a slot the steps left free. Returns the mean loss on the last stage, 0
  // elsewhere. Blocking; collective over the pipeline, between steps.
  double forward_only(const Tensor& inputs, const Tensor& targets, int64_t t);

  // Called on the training thread for every compute action and every wait; empty: off.
  void set_observer(std::function<void(const PipeSpan&)> observer);
  // Called on the last stage with each micro-batch's tokens before its loss, to set what
  // the loss mixes in (distillation's targets); empty: the plain cross-entropy.
  using LossTargets = std::function<void(const Tensor& tokens, nn::CrossEntropyCtx& loss)>;
  void set_loss_targets(LossTargets targets);

  const PipelineStats& stats() const;
  const Schedule& schedule() const;
  int stage() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::parallel
