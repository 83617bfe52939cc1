// A parameter-server worker's step (parallelize_ps_worker, parallelize.h): the same
// interface as the mesh's, with the optimizer on the servers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "loom/core/error.h"
#include "loom/parallel/parallelize.h"
#include "parallel/micro_steps.h"

namespace loom::parallel {
namespace {

using Clock = std::chrono::steady_clock;

class PsWorkerStep final : public Parallelized {
 public:
  PsWorkerStep(nn::Model& model, PsJob& job, const StepConfig& config)
      : model_(model),
        job_(job),
        config_(config),
        local_(job.host_workers()),
        // The gradient sums over this worker's micro-batches and, with a host reduce, over
        // its host's workers (an all-reduce over shared memory, overlapped with backward);
        // exact limbs in deterministic mode.
        dp_(local_, model.params(), {.bucket_mb = config.dp.bucket_mb, .deterministic = config.dp.deterministic},
            model.block_offsets()),
        scaler_(config.loss_scale),
        ctx_(model.make_ctx()) {
    hook_ = model.hooks().add([this](int block, BlockPhase phase) { dp_.on_block(block, phase); });
    if (!job.links().empty())
      worker_.emplace(job.links(), model.params(), job.bounds(model.params().numel()), job.mode());
  }
  ~PsWorkerStep() override { model_.hooks().remove(hook_); }

  StepResult step(int64_t step, const MicroBatches& batch, double lr) override;
  EvalResult evaluate(const data::Examples&, int64_t, int64_t) override {
    check_failed(__FILE__, __LINE__, "a parameter-server worker does not evaluate: the first server does");
  }
  void sync_params() override {
    reply_ = share(leader() ? worker_->hello(config_.accum * local_.size()) : PsReply{});
    if (reply_.stop && leader()) worker_->goodbye();  // joined after the run's end
  }
  std::optional<int64_t> steps_done() const override { return reply_.step; }
  bool run_over() const override { return reply_.stop; }
  RankShare share(checkpoint::PieceArena*) const override {
    check_failed(__FILE__, __LINE__, "a parameter-server worker saves nothing: the servers save their ranges");
  }
  size_t share_bytes() const override { return 0; }
  void load_optimizer(checkpoint::Checkpoint&) override {
    check_failed(__FILE__, __LINE__, "a parameter-server worker keeps no optimizer state: the servers do");
  }
  optim::LossScaler& loss_scaler() override { return scaler_; }
  void set_tracer(StepTracer* tracer) override {
    tracer_ = tracer;
    trace_step_parts(tracer);
  }
  void set_loss_targets(LossTargets targets) override { loss_targets_ = std::move(targets); }
  StateBytes state_bytes() const override { return dp_.state_bytes(); }
  int replica() const override { return job_.worker(); }

 private:
  bool leader() const { return worker_.has_value(); }
  // The leader's exchange, and the parameters it pulled, to the rest of its host's workers.
  PsReply share(PsReply r) {
    if (local_.size() == 1) return r;
    double fields[2] = {static_cast<double>(r.step), r.stop ? 1.0 : 0.0};
    comm::broadcast(local_, {.buffer = fields, .count = 2, .dtype = DType::kF64});
    ParamSet& params = model_.params();
    comm::broadcast(local_, {.buffer = params.values().raw(), .count = static_cast<size_t>(params.numel())});
    return PsReply{.step = static_cast<int64_t>(fields[0]), .stop = fields[1] != 0};
  }
  void trace_exchange(Clock::time_point exchange, const PsReply& reply);

  nn::Model& model_;
  PsJob& job_;
  StepConfig config_;
  comm::Communicator& local_;
  DataParallel dp_;
  optim::LossScaler scaler_;
  std::unique_ptr<nn::ModelCtx> ctx_;
  nn::BlockHooks::Id hook_{};
  std::optional<PsWorker> worker_;  // a leader's: its links to every server
  PsReply reply_;
  StepTracer* tracer_ = nullptr;
  LossTargets loss_targets_;
};

StepResult PsWorkerStep::step(int64_t step, const MicroBatches& batch, double /*lr: the servers'*/) {
  const bool sync = job_.mode() == PsMode::kSync;
  // Sync: the workers' gradients add up to the global batch's mean. Async and ssp: each push
  // is its own update, the mean over this worker's items.
  const double scale = 1.0 / static_cast<double>(config_.accum * (sync ? job_.workers() : 1));
  dp_.begin_step();
  std::vector<double> losses =
      whole_model_micro_steps(model_, *ctx_, dp_, config_.accum, batch, scale, loss_targets_, tracer_);
  const DataParallel::Gradients g = dp_.finish_gradients();
  StepResult r;
  const int64_t local_bytes = local_.size() > 1 ? dp_.take_stats().bytes : 0;  // one rank's "all-reduce" moves nothing
  if (local_.size() > 1) {  // the host's losses in worker order, as the servers sum them
    std::vector<double> all(losses.size() * static_cast<size_t>(local_.size()));
    comm::all_gather(local_, {.input = losses.data(), .output = all.data(), .count = losses.size(), .dtype = DType::kF64});
    losses = std::move(all);
  }
  double sum = 0;
  for (double l : losses) sum += l;
  r.loss = sum / static_cast<double>(losses.size());
  r.grad_norm = sync ? 0 : optim::clip_grad_norm(model_.params(), config_.grad_clip);
  if (!sync && !std::isfinite(r.grad_norm))
    throw RuntimeError(cat("step ", step, ": this worker's gradient norm is not finite (", r.grad_norm,
                           "); it stops without pushing (a lower training.lr or a training.grad_clip may help)"));
  const auto exchange = Clock::now();
  reply_ = share(leader() ? worker_->push_pull({.step = step - 1, .grads = g.sums, .losses = losses, .grad_norm = r.grad_norm,
                                                .unsummable = g.unsummable, .local_bytes = local_bytes})
                          : PsReply{});
  if (tracer_) trace_exchange(exchange, reply_);
  if (reply_.stop && leader()) worker_->goodbye();
  r.comm.bytes = local_bytes;
  r.ps = reply_;
  return r;
}

// The exchange on the communication track: a leader's push and pull, another worker's
// wait for its host's leader.
void PsWorkerStep::trace_exchange(Clock::time_point exchange, const PsReply& reply) {
  obs::Trace& trace = tracer_->trace();
  const auto ms = [](double x) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(x)); };
  const auto pushed = exchange + ms(reply.push_ms);
  if (leader()) {
    trace.span(obs::Trace::kComm, "push gradients", exchange, pushed, {{"staleness", cat(reply.staleness)}});
    trace.span(obs::Trace::kComm, "pull parameters", pushed, pushed + ms(reply.pull_ms), {{"held_ms", cat(reply.held_ms)}});
  } else {
    trace.span(obs::Trace::kComm, "parameters from the host's leader", exchange, Clock::now());
  }
}

}  // namespace

std::unique_ptr<Parallelized> parallelize_ps_worker(nn::Model& model, PsJob& job, const StepConfig& config) {
  return std::make_unique<PsWorkerStep>(model, job, config);
}

}  // namespace loom::parallel
