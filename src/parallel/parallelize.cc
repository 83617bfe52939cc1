#include "loom/parallel/parallelize.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/core/log.h"
#include "parallel/micro_steps.h"

namespace loom::parallel {

EvalResult evaluate(const nn::Model& model, const data::Examples& val, int64_t max_items, int64_t batch,
                    nn::ModelCtx* ctx) {
  const int64_t n = max_items > 0 ? std::min(max_items, val.size()) : val.size();
  std::unique_ptr<nn::ModelCtx> own;
  if (ctx == nullptr) {
    own = model.make_ctx();
    ctx = own.get();
  }
  double loss_sum = 0;
  int64_t correct = 0;
  bool classifies = false;
  std::vector<int64_t> items;
  for (int64_t start = 0; start < n; start += batch) {
    items.clear();
    for (int64_t i = start; i < std::min(n, start + batch); ++i) items.push_back(i);
    const data::Batch b = val.batch(items);
    const nn::EvalSums s = model.evaluate(b.inputs, b.targets, *ctx);
    loss_sum += s.loss * static_cast<double>(items.size());
    classifies = s.correct >= 0;
    correct += std::max<int64_t>(s.correct, 0);
  }
  EvalResult r;
  r.items = n * val.tokens_per_example();
  r.loss = n == 0 ? 0.0 : loss_sum / static_cast<double>(n);
  if (classifies) r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return r;
}

namespace {

// The mesh's step: data parallelism (and ZeRO) over the replicas, the pipeline executor over
// the stages, the tensor-parallel seam the model was built with.
class MeshStep final : public Parallelized {
 public:
  MeshStep(nn::Model& m, Mesh& me, comm::Communicator& w, const StepConfig& c)
      : model(m),
        mesh(me),
        world(w),
        config(c),
        piped(me.pp > 1),
        dp(me.split() ? *me.dp : w, m.params(), c.dp, m.block_offsets()),
        update(dp, c.optimizer),
        scaler(c.loss_scale),
        ctx(m.make_ctx()) {}
  ~MeshStep() override {
    for (nn::BlockHooks::Id id : hooks) model.hooks().remove(id);
  }

  StepResult step(int64_t step, const MicroBatches& batch, double lr) override;
  EvalResult evaluate(const data::Examples& val, int64_t max_items, int64_t batch) override;
  void sync_params() override { dp.sync_params(); }
  RankShare share(checkpoint::PieceArena* arena) const override {
    return rank_share(mesh, model.params(), dp, update, arena);
  }
  size_t share_bytes() const override { return parallel::share_bytes(mesh, model.params(), dp, update); }
  void load_optimizer(checkpoint::Checkpoint& ck) override;
  optim::LossScaler& loss_scaler() override { return scaler; }
  void set_tracer(StepTracer* tracer) override;
  void set_loss_targets(LossTargets targets) override;
  StateBytes state_bytes() const override {
    StateBytes b = dp.state_bytes();
    b.optimizer = update.state_bytes();
    return b;
  }
  int replica() const override { return dp.rank(); }

  nn::Model& model;
  Mesh& mesh;
  comm::Communicator& world;
  StepConfig config;
  bool piped;
  DataParallel dp;
  OptimizerStep update;  // the optimizer over what dp says this rank updates; the norm; clipping
  // Pipeline stages: the executor runs the schedule's list and brackets each backward
  // piece for DataParallel; without a pipeline the model's block hooks report to it.
  std::unique_ptr<Pipeline> pipe;
  std::vector<nn::BlockHooks::Id> hooks;
  optim::LossScaler scaler;
  StepTracer* tracer = nullptr;
  LossTargets loss_targets;
  std::unique_ptr<nn::ModelCtx> ctx;  // the micro-steps' without a pipeline

  std::vector<double> micro_steps(const MicroBatches& batch, double scale);
  void finish(StepResult& r, int64_t step, double lr);
  EvalResult evaluate_stages(const data::Examples& val, int64_t max_items, int64_t batch);
};

std::vector<double> MeshStep::micro_steps(const MicroBatches& batch, double scale) {
  std::vector<double> losses;
  if (piped) {
    if (tracer) tracer->push(cat("pipeline ", schedule_kind_name(config.pp_schedule), ", stage ", mesh.stage));
    losses = pipeline_step(
        mesh, *pipe, dp,
        [&](int m) {
          data::Batch b = batch(m);
          return std::pair<Tensor, Tensor>{b.inputs, b.targets};
        },
        config.micro_batch, config.t, scale);
    if (tracer) tracer->pop();
    return losses;
  }
  return whole_model_micro_steps(model, *ctx, dp, config.accum, batch, scale, loss_targets, tracer);
}

StepResult MeshStep::step(int64_t step, const MicroBatches& batch, double lr) {
  MeshStep& m = *this;
  StepResult r;
  m.dp.begin_step();
  // fp16: the loss times the scale (times 2^40 in a step debug.overflow_at names).
  const std::vector<int64_t>& overflow = m.config.overflow_at;
  r.loss_scale = !m.config.fp16 ? 1
                 : m.scaler.scale() * (std::binary_search(overflow.begin(), overflow.end(), step) ? 0x1p40 : 1);
  const double backward_scale = r.loss_scale / static_cast<double>(m.config.accum * m.mesh.dp_size);
  r.loss = m.dp.mean_loss(m.micro_steps(batch, backward_scale));
  if (m.piped) r.bubble = pipeline_bubble(m.mesh, *m.pipe);
  m.finish(r, step, lr);
  return r;
}

void MeshStep::finish(StepResult& r, int64_t step, double lr) {
  if (tracer) tracer->push("optimizer step");
  r.grad_norm = update.step(lr, config.grad_clip, r.loss_scale);
  if (tracer) tracer->pop();
  // fp16: gradients that overflowed skip the step (nothing was updated) and halve
  // the scale; a finite loss with overflowing gradients at the smallest scale stops.
  const bool fp16 = config.fp16;
  r.skipped = fp16 && std::isfinite(r.loss) && !std::isfinite(r.grad_norm);
  if (fp16 && !scaler.update(r.skipped))
    throw RuntimeError(cat("step ", step, ": fp16 gradients overflow even at loss scale ", scaler.scale(),
                           ", the smallest; train in training.precision = \"bf16\" (f32's range) or \"fp32\", or "
                           "with a lower training.lr"));
  if (r.skipped)
    log_warn(cat("step ", step, ": fp16 gradients overflowed at loss scale ", r.loss_scale,
                 "; the step is skipped and the scale lowered to ", scaler.scale()));
  // A loss or gradient norm that is not finite: every rank sees the same global loss and
  // norm, and names the first gradient that is not (collective over the group).
  if (!r.skipped && (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))) {
    const std::string first = dp.first_nonfinite_gradient();
    const std::string part = mesh.split() ? " (this rank's part of the model)" : "";
    r.nonfinite = cat("the loss (", r.loss, ") or the gradient norm (", r.grad_norm, ") is not finite; ",
                      first.empty() ? std::string("every gradient is finite")
                      : config.dp.deterministic
                          ? cat("the first gradient deterministic mode cannot sum exactly (not finite, or 2^31 "
                                "or more in magnitude) is ", first, part)
                          : cat("the first non-finite gradient is ", first, part));
  }
  r.comm = dp.take_stats();
  if (piped) r.pipe = pipe->stats();
  if (mesh.tp > 1) r.tp = mesh.seam->take_stats();
}

// Forward only through the stages, a batch at a time; the last stage's sum to every stage.
EvalResult MeshStep::evaluate_stages(const data::Examples& val, int64_t max_items, int64_t batch) {
  const int64_t n = max_items > 0 ? std::min(max_items, val.size()) : val.size();
  double sum = 0;
  std::vector<int64_t> items;
  for (int64_t start = 0; start < n; start += batch) {
    items.clear();
    for (int64_t i = start; i < std::min(n, start + batch); ++i) items.push_back(i);
    const data::Batch b = val.batch(items);
    sum += pipe->forward_only(b.inputs, b.targets, config.t) * static_cast<double>(items.size());
  }
  comm::broadcast(*mesh.pipe, {.buffer = &sum, .count = 1, .dtype = DType::kF64, .root = mesh.pp - 1});
  EvalResult r;
  r.items = n * val.tokens_per_example();
  r.loss = n == 0 ? 0.0 : sum / static_cast<double>(n);
  return r;
}

// Every rank evaluates its own part of the model in its own layout: pipeline stages in turn,
// tensor-parallel pieces with the vocabulary-parallel loss, ZeRO 3 gathering a block at a
// time through the block hook; rank 0's figures go to every rank.
EvalResult MeshStep::evaluate(const data::Examples& val, int64_t max_items, int64_t batch) {
  MeshStep& m = *this;
  // The steps' own context (its arena keeps a micro-batch's memory); a teacher's targets
  // there are dropped, so that validation is the plain cross-entropy.
  if (!m.piped) m.model.loss_ctx(*m.ctx).distill = {};
  const EvalResult r = m.piped ? m.evaluate_stages(val, max_items, batch)
                               : parallel::evaluate(m.model, val, max_items, batch, m.ctx.get());
  m.dp.release_gathered();
  if (m.mesh.tp > 1) m.mesh.seam->take_stats();  // the step's figures count the step's collectives only
  double figures[3] = {r.loss, r.accuracy, static_cast<double>(r.items)};
  comm::broadcast(m.world, {.buffer = figures, .count = 3, .dtype = DType::kF64, .root = 0});
  return {.loss = figures[0], .accuracy = figures[1], .items = static_cast<int64_t>(figures[2])};
}

void MeshStep::load_optimizer(checkpoint::Checkpoint& ck) {
  optim::RangeState st = update.kept_state();  // in place, only what this rank keeps
  ck.load_optimizer(model.params(), st);
  update.set_steps(st.steps);
}

void MeshStep::set_tracer(StepTracer* tracer) {
  MeshStep& m = *this;
  m.tracer = tracer;
  if (tracer == nullptr) {
    m.dp.set_comm_observer(nullptr);
    if (m.mesh.tp > 1) m.mesh.seam->set_observer(nullptr);
    if (m.piped) m.pipe->set_observer(nullptr);
    return;
  }
  m.dp.set_comm_observer([tracer](const CommSpan& s) { tracer->on_comm(s); });
  if (m.mesh.tp > 1) m.mesh.seam->set_observer([tracer](const CommSpan& s) { tracer->on_comm(s); });
  if (m.piped)  // each compute action and each wait for a neighbour: the schedule as it ran
    m.pipe->set_observer(
        [tracer](const PipeSpan& s) { tracer->trace().span(obs::Trace::kTraining, s.what, s.begin, s.end); });
}

void MeshStep::set_loss_targets(LossTargets targets) {
  loss_targets = targets;
  if (piped) pipe->set_loss_targets(std::move(targets));
}

}  // namespace

std::vector<double> whole_model_micro_steps(nn::Model& model, nn::ModelCtx& ctx, DataParallel& dp, int64_t accum,
                                            const Parallelized::MicroBatches& batch, double scale,
                                            const LossTargets& targets, StepTracer* tracer) {
  std::vector<double> losses;
  for (int64_t m = 0; m < accum; ++m) {
    if (tracer) tracer->push(cat("micro-step ", m));
    dp.begin_micro_step(m == accum - 1);
    const data::Batch b = batch(m);
    if (targets) targets(b.inputs, model.loss_ctx(ctx));
    losses.push_back(model.forward(b.inputs, b.targets, ctx));
    model.backward(ctx, scale);
    dp.end_micro_step();
    if (tracer) tracer->pop();
  }
  return losses;
}

std::unique_ptr<Parallelized> parallelize(nn::Model& model, Mesh& mesh, comm::Communicator& world,
                                          const StepConfig& config) {
  auto impl = std::make_unique<MeshStep>(model, mesh, world, config);
  MeshStep& m = *impl;
  if (mesh.split()) m.dp.set_stage_groups(stage_groups(mesh, model.params()));
  MeshStep* p = &m;
  // The block hooks: data parallelism's (which starts the replicas' sums of each block's
  // gradients as they become final) and, without a pipeline (whose executor traces its own
  // actions), a traced step's spans around each block, data parallelism's waits between.
  if (!m.piped)
    m.hooks.push_back(model.hooks().add([p](int b, BlockPhase ph) {
      if (p->tracer) p->tracer->before_block(b, ph);
    }));
  m.hooks.push_back(model.hooks().add([p](int b, BlockPhase ph) { p->dp.on_block(b, ph); }));
  if (!m.piped)
    m.hooks.push_back(model.hooks().add([p](int b, BlockPhase ph) {
      if (p->tracer) p->tracer->after_block(b, ph);
    }));
  if (m.piped)
    m.pipe = std::make_unique<Pipeline>(
        *mesh.pipe, make_schedule(config.pp_schedule, mesh.pp, static_cast<int>(config.accum), mesh.v), model,
        mesh.stage_ranks());
  return impl;
}

}  // namespace loom::parallel
