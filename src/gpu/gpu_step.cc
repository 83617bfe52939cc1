// `loom train` on a GPU (loom/gpu/gpu.h, parallelize_on_gpu): GptTrainer behind the
// Parallelized interface of every layout's step. The host model keeps the weights that
// checkpoints read: they come back from the device only when a checkpoint is taken (and
// the moments with them), so a step moves nothing but the tokens and two figures.
// Data parallel over the world's ranks (one GPU each, or several sharing one): every rank
// keeps the whole model; the gradients, pre-divided by the replicas, are summed by
// GptTrainer::all_reduce_grads or its NCCL twin (data parallel, ZeRO 1) or reduced to each
// rank's shard by reduce_scatter_grads (ZeRO 2). Without ZeRO every rank keeps all of
// AdamW's moments; with it, its zero_shard's alone, updates that shard and all-gathers the
// weights. A checkpoint takes each rank's zero_shard of the flat buffers.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "loom/checkpoint/tensor_pieces.h"
#include "loom/comm/comm.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/gpu/gpu.h"

namespace loom::gpu {
namespace {

std::span<const int32_t> ids(const Tensor& x) {
  LOOM_CHECK(x.dtype() == DType::kI32);
  return {x.data<int32_t>(), static_cast<size_t>(x.numel())};
}

class GpuStep : public parallel::Parallelized {
 public:
  GpuStep(nn::Gpt& model, const parallel::StepConfig& config, comm::Communicator& world, int device, bool nccl)
      : model_(model),
        config_(config),
        world_(world),
        trainer_(model, trainer_config(config, model, world, device)),
        nccl_(nccl) {}

  parallel::StepResult step(int64_t /*step*/, const MicroBatches& batch, double lr) override {
    parallel::StepResult r;
    const double replicas = world_.size();
    const double scale = 1.0 / static_cast<double>(config_.accum);
    for (int64_t m = 0; m < config_.accum; ++m) {
      const data::Batch b = batch(m);
      r.loss += trainer_.forward_backward(ids(b.inputs), ids(b.targets), scale / replicas) * scale;
    }
    if (world_.size() > 1) {  // the mean over the replicas, of the loss and the gradients
      r.comm = config_.dp.zero == 2 ? trainer_.reduce_scatter_grads(world_)
               : nccl_                ? trainer_.all_reduce_grads_nccl(world_)
                                      : trainer_.all_reduce_grads(world_);
      comm::all_reduce(world_, {.output = &r.loss, .count = 1, .dtype = DType::kF64});
      r.loss /= replicas;
    }
    // As the CPU's step: a loss or gradient norm that is not finite updates nothing, and
    // the trainer stops the run naming it.
    if (!std::isfinite(r.loss)) {
      r.nonfinite = "the loss is not finite (on the GPU)";
      return r;
    }
    r.grad_norm = trainer_.step(lr, sharded() ? &world_ : nullptr, &r.comm);
    if (!std::isfinite(r.grad_norm)) {
      r.nonfinite = "the gradient norm is not finite (on the GPU)";
      return r;
    }
    on_host_ = false;
    return r;
  }

  // The loss on the device, batch examples at a time (at most micro_batch).
  parallel::EvalResult evaluate(const data::Examples& val, int64_t max_items, int64_t batch) override {
    const int64_t items = max_items > 0 ? std::min(max_items, val.size()) : val.size();
    const int64_t per = std::max<int64_t>(1, std::min(batch, config_.micro_batch));
    double sum = 0;
    int64_t tokens = 0;
    for (int64_t first = 0; first < items; first += per) {
      std::vector<int64_t> which;
      for (int64_t i = first; i < std::min(items, first + per); ++i) which.push_back(i);
      const data::Batch b = val.batch(which);
      sum += trainer_.loss(ids(b.inputs), ids(b.targets)) * static_cast<double>(b.targets.numel());
      tokens += b.targets.numel();
    }
    return {.loss = tokens > 0 ? sum / static_cast<double>(tokens) : 0.0, .accuracy = -1, .items = items};
  }

  // The device gets replica 0's host weights (a resume's, or the initialization).
  void sync_params() override {
    if (world_.size() > 1)
      comm::broadcast(world_, {.buffer = model_.params().values().raw(),
                               .count = static_cast<size_t>(model_.params().numel()),
                               .dtype = DType::kF32});
    trainer_.copy_params_from(model_.params());
  }

  parallel::RankShare share(checkpoint::PieceArena* arena) const override {
    bring_home();
    const ParamSet& ps = model_.params();
    const std::pair<int64_t, int64_t> part = slice();
    auto pieces = [&](const void* data, const std::string& prefix) {
      const std::vector<checkpoint::FlatRun> runs = {
          {part.first, part.second, static_cast<const float*>(data) + part.first}};
      return arena != nullptr ? checkpoint::pieces(ps, runs, prefix, arena) : checkpoint::pieces_in_place(ps, runs, prefix);
    };
    if (arena != nullptr) arena->reserve(share_bytes());
    parallel::RankShare share;
    share.model = pieces(ps.values().raw(), "");
    share.optimizer_steps = trainer_.steps();
    for (const auto& [role, buffer] : {std::pair{"exp_avg", &exp_avg_}, std::pair{"exp_avg_sq", &exp_avg_sq_}})
      for (checkpoint::Piece& p : pieces(buffer->raw(), std::string(role) + "."))
        share.optimizer.push_back(std::move(p));
    return share;
  }
  size_t share_bytes() const override {
    const std::pair<int64_t, int64_t> part = slice();
    return 3 * static_cast<size_t>(part.second - part.first) * sizeof(float);
  }

  void load_optimizer(checkpoint::Checkpoint& ck) override {
    // every moment, or (ZeRO) the shard's: the trainer reads no other
    const std::pair<int64_t, int64_t> part = sharded() ? slice() : std::pair{int64_t{0}, model_.params().numel()};
    optim::RangeState st;
    st.ranges = {part};
    st.buffers = {{"exp_avg", {exp_avg_.slice_rows(part.first, part.second)}},
                  {"exp_avg_sq", {exp_avg_sq_.slice_rows(part.first, part.second)}}};
    ck.load_optimizer(model_.params(), st);
    trainer_.copy_moments_from(exp_avg_, exp_avg_sq_, st.steps);
  }

  optim::LossScaler& loss_scaler() override { return scaler_; }
  void set_tracer(parallel::StepTracer* /*tracer*/) override {}  // the step is one device call; docs/gpu.md
  void set_loss_targets(parallel::LossTargets /*targets*/) override {
    throw InputError("training.teacher: distillation does not run on the GPU yet; expected job.device = \"cpu\"");
  }
  parallel::StateBytes state_bytes() const override {
    // The device's memory is the trainer's (loom bench gpu reports it); the host keeps one
    // copy of the weights and, after a checkpoint, of the moments.
    const int64_t n = model_.params().numel() * static_cast<int64_t>(sizeof(float));
    const std::pair<int64_t, int64_t> part = slice();
    const int64_t moments = sharded() ? (part.second - part.first) * static_cast<int64_t>(sizeof(float)) : n;
    return {.params = n, .grads = 0, .optimizer = on_host_ ? 2 * moments : 0};
  }
  int replica() const override { return world_.rank(); }

 private:
  // The part [lo, hi) of the flat buffers this rank writes into a checkpoint (and, under
  // ZeRO, updates).
  std::pair<int64_t, int64_t> slice() const { return zero_shard(model_.params().numel(), world_.rank(), world_.size()); }
  bool sharded() const { return config_.dp.zero > 0 && world_.size() > 1; }
  static GptTrainerConfig trainer_config(const parallel::StepConfig& c, const nn::Gpt& model,
                                         const comm::Communicator& world, int device) {
    GptTrainerConfig tc;
    if (c.dp.zero > 0 && world.size() > 1) {
      tc.zero_rank = world.rank();
      tc.zero_ranks = world.size();
    }
    tc.micro_batch = c.micro_batch;
    tc.seq_len = c.t > 0 ? c.t : model.config().seq_len;
    tc.optimizer = c.optimizer;
    tc.max_grad_norm = c.grad_clip;
    tc.device = device;
    return tc;
  }

  // The device's weights and moments into the host buffers a checkpoint reads.
  void bring_home() const {
    if (on_host_) return;
    trainer_.copy_params_to(model_.params());
    trainer_.copy_moments_to(exp_avg_, exp_avg_sq_);
    on_host_ = true;
  }

  nn::Gpt& model_;
  parallel::StepConfig config_;
  comm::Communicator& world_;
  GptTrainer trainer_;
  const bool nccl_;  // the gradients' all-reduce by NCCL (each rank its own device)
  optim::LossScaler scaler_;
  Tensor exp_avg_ = Tensor::zeros({model_.params().numel()}, DType::kF32);
  Tensor exp_avg_sq_ = Tensor::zeros({model_.params().numel()}, DType::kF32);
  mutable bool on_host_ = true;
};

}  // namespace

std::unique_ptr<parallel::Parallelized> parallelize_on_gpu(nn::Gpt& model, const parallel::StepConfig& config,
                                                           comm::Communicator& world) {
  if (config.fp16) throw InputError("training.precision = \"fp16\": the GPU trains in bf16; expected \"bf16\"");
  // One device per rank of a host, in turn: ranks beyond the host's devices share them.
  // NCCL sums the gradients where every rank has a device of its own (it refuses two ranks
  // on one) and the whole gradient is summed (not ZeRO 2's reduce-scatter); elsewhere Loom's
  // transports do, through pinned memory. Every rank decides alike (the minimum over the
  // world), so they agree.
  const std::vector<int>& local = world.local_ranks();
  const auto mine = std::find(local.begin(), local.end(), world.rank()) - local.begin();
  const int devices = device_count();
  int own = static_cast<int>(local.size()) <= devices ? 1 : 0;
  comm::all_reduce(world, {.output = &own, .count = 1, .dtype = DType::kI32, .op = comm::ReduceOp::kMin});
  const bool nccl = nccl_compiled() && world.size() > 1 && own == 1 && config.dp.zero != 2;
  if (nccl && world.rank() == 0) log_info("the gradients' all-reduce goes through NCCL (a device per rank)");
  return std::make_unique<GpuStep>(model, config, world, devices > 0 ? static_cast<int>(mine % devices) : 0, nccl);
}

}  // namespace loom::gpu
