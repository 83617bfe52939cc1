// parallel::parallelize (DESIGN.md section 3, docs/architecture.md): a model laid out on a
// dp x pp x tp mesh, as one object that owns the training step. The trainer calls step()
// once per optimizer step with this replica's micro-batches and gets the loss, the gradient
// norm and the step's communication figures; evaluate(), the checkpoint share and the
// optimizer state for a resume come from the same object. Inside: the data-parallel
// gradient sums and ZeRO (DataParallel), the pipeline executor over the model's block
// ranges, the tensor-parallel seam the model was built with, and the update (OptimizerStep:
// the optimizer, fp16's loss scaling and the gradient norm over the stages and pieces).
// A parameter-server worker's step is the same interface (parallelize_ps_worker).
//
// Thread-safety: one thread (the training thread) drives a Parallelized.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/checkpoint/checkpoint.h"
#include "loom/parallel/checkpointing.h"
#include "loom/parallel/data_parallel.h"
#include "loom/data/examples.h"
#include "loom/optim/loss_scale.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/optimizer_step.h"
#include "loom/nn/model.h"
#include "loom/optim/optim.h"
#include "loom/parallel/param_server.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/ps_job.h"
#include "loom/parallel/schedule.h"
#include "loom/parallel/step_tracer.h"
#include "loom/parallel/tensor_parallel.h"

namespace loom::parallel {

// How a step is run (built once from [training], [parallel] and [comm]).
struct StepConfig {
  DataParallelConfig dp;
  optim::OptimizerConfig optimizer;
  ScheduleKind pp_schedule = ScheduleKind::kOneFOneB;
  // Per replica and step: `accum` micro-batches of `micro_batch` examples of `t` positions.
  int64_t micro_batch = 1, accum = 1, t = 1;
  double grad_clip = 0;  // 0: none
  // [training] precision = "fp16": dynamic loss scaling (docs/numerics.md, "Mixed precision").
  bool fp16 = false;
  optim::LossScaleConfig loss_scale;
  // debug.overflow_at: the steps (1-based) whose loss scale is multiplied by 2^40.
  std::vector<int64_t> overflow_at;
};

// What one optimizer step did, on this rank.
struct StepResult {
  double loss = 0;       // the mean over every replica's micro-batches
  double grad_norm = 0;  // of the whole model, before clipping
  double loss_scale = 1;  // what backward ran on (fp16)
  bool skipped = false;   // fp16: the gradients overflowed; nothing was updated
  // Not skipped, and the loss or the norm is not finite: nothing was updated, and this says
  // which gradient was the first not finite (collective: every rank has it), for the error.
  std::string nonfinite;
  CommStats comm;  // the replicas' gradient communication
  std::optional<TensorParallelSeam::Stats> tp;  // tp > 1
  std::optional<PipelineStats> pipe;            // pp > 1
  PipelineBubble bubble;                        // pp > 1
  std::optional<PsReply> ps;                    // a parameter-server worker's exchange
};

// Validation over a dataset: the mean loss, a classifier's accuracy (-1 otherwise), and
// how many tokens (or images) it covered.
struct EvalResult {
  double loss = 0;
  double accuracy = -1;
  int64_t items = 0;
};

// Validation of a model (the whole of it, or a tensor-parallel piece with its pieces in
// step): examples [0, max_items) of `val` (0: all) in order, `batch` at a time, in `ctx`
// (null: a context of its own).
EvalResult evaluate(const nn::Model& model, const data::Examples& val, int64_t max_items, int64_t batch,
                    nn::ModelCtx* ctx = nullptr);

// What the loss mixes in for a micro-batch (distillation's targets), set from its inputs.
using LossTargets = std::function<void(const Tensor& inputs, nn::CrossEntropyCtx& loss)>;

// The training step of one rank, whatever the layout: a mesh of data, pipeline and tensor
// parallelism (parallelize), or a parameter-server worker (parallelize_ps_worker).
class Parallelized {
 public:
  virtual ~Parallelized() = default;

  // One optimizer step (the 1-based `step` for debug.overflow_at) over this replica's
  // micro-batches batch(0) ... batch(accum - 1), at learning rate lr. RuntimeError when the
  // fp16 gradients overflow even at the smallest loss scale. Collective over the mesh.
  using MicroBatches = std::function<data::Batch(int64_t microbatch)>;
  virtual StepResult step(int64_t step, const MicroBatches& batch, double lr) = 0;

  // Validation of the model as trained, in its layout: no rank gathers the model or
  // computes whole logits unless the layout is whole (pipeline stages forward in turn,
  // tensor-parallel pieces with the vocabulary-parallel loss, ZeRO 3 a block at a time).
  // Every rank gets the figures. Collective over the mesh. (A parameter-server worker
  // does not evaluate: the first server does.)
  virtual EvalResult evaluate(const data::Examples& val, int64_t max_items, int64_t batch) = 0;

  // Broadcasts replica 0's parameters and checks every replica holds the same bits; ZeRO 3
  // then keeps only this rank's parts (a parameter-server worker: pulls the servers'
  // parameters). Collective, before the first step.
  virtual void sync_params() = 0;
  // Where the steps are counted elsewhere (a parameter-server worker: by the servers), the
  // steps done when sync_params() or the last step() returned; nullopt for the caller's own count.
  virtual std::optional<int64_t> steps_done() const { return std::nullopt; }
  // Whether the run is over by someone else's count (a parameter-server worker: the servers
  // said so); the caller stops stepping.
  virtual bool run_over() const { return false; }
  // This rank's share of a checkpoint, from its own masters (ZeRO 3: its shard), and its size.
  virtual RankShare share(checkpoint::PieceArena* arena) const = 0;  // arena null: made in place (rank_share)
  virtual size_t share_bytes() const = 0;
  // Loads the optimizer state this rank keeps from `ck` and the optimizer's step count.
  virtual void load_optimizer(checkpoint::Checkpoint& ck) = 0;

  // fp16's loss scale, to save and restore.
  virtual optim::LossScaler& loss_scaler() = 0;
  // Traces (null: off): the steps record their spans and collectives into `tracer`.
  virtual void set_tracer(StepTracer* tracer) = 0;
  // What the loss mixes in (distillation); empty: the plain cross-entropy.
  virtual void set_loss_targets(LossTargets targets) = 0;

  virtual StateBytes state_bytes() const = 0;
  virtual int replica() const = 0;  // this rank's data-parallel index (a worker's data shard)
};

// Lays out `model` (already this rank's part and tensor-parallel piece: mesh_part() and
// Mesh::shard()) on `mesh` (split over `world`). The model, mesh and world outlive the
// result. Collective over the mesh (the pipeline's links).
std::unique_ptr<Parallelized> parallelize(nn::Model& model, Mesh& mesh, comm::Communicator& world,
                                          const StepConfig& config);

// A parameter-server worker's step (docs/parallelism.md, "Parameter servers"): this
// worker's micro-batches summed (with its host's workers first when `job` groups them),
// clipped by this worker's norm in async and ssp, pushed to every server, and the new
// parameters pulled. StepResult::ps says what the servers answered; once its `stop` is
// set the worker has said goodbye and the run is over. `model` is whole; config.accum is
// this worker's micro-batches per step. The model and job outlive the result.
std::unique_ptr<Parallelized> parallelize_ps_worker(nn::Model& model, PsJob& job, const StepConfig& config);

}  // namespace loom::parallel
