#include "loom/parallel/parallelize.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/core/log.h"
#include "parallel/micro_steps.h"

namespace loom::parallel {

namespace {

// Validation's figures, a batch at a time: examples [b * batch, (b + 1) * batch) of the
// first n make batch b, and sums[2b], sums[2b + 1] hold its loss times its examples and its
// correct count (-1: not a classifier). A replica fills the batches it evaluated and leaves
// zeros elsewhere, so a sum over replicas is exact (x + 0 is x) and `figures` then adds the
// batches in order, as one rank evaluating them all would: the same bits in every layout.
struct BatchSums {
  int64_t n = 0, batch = 1;
  std::vector<double> sums;
  // Examples [0, max_items) of `val` (0: all), `batch_size` at a time (a batch past n is n:
  // one batch, and n + batch stays far from overflowing, whatever --batch asked).
  BatchSums(const data::Examples& val, int64_t max_items, int64_t batch_size)
      : n(max_items > 0 ? std::min(max_items, val.size()) : val.size()),
        batch(std::clamp<int64_t>(batch_size, 1, std::max<int64_t>(n, 1))),
        sums(static_cast<size_t>(2 * ((n + batch - 1) / batch))) {}
  int64_t batches() const { return static_cast<int64_t>(sums.size() / 2); }
  int64_t end(int64_t b) const { return std::min(n, (b + 1) * batch); }
  std::vector<int64_t> items(int64_t b) const {
    std::vector<int64_t> out;
    for (int64_t i = b * batch; i < end(b); ++i) out.push_back(i);
    return out;
  }
  void set(int64_t b, double loss, int64_t correct) {
    sums[2 * b] = loss * static_cast<double>(end(b) - b * batch);
    sums[2 * b + 1] = static_cast<double>(correct);
  }
  EvalResult figures(int64_t tokens_per_example) const {
    double loss_sum = 0;
    int64_t correct = 0;
    for (int64_t b = 0; b < batches(); ++b) {
      loss_sum += sums[2 * b];
      correct += std::max<int64_t>(static_cast<int64_t>(sums[2 * b + 1]), 0);
    }
    EvalResult r;
    r.items = n * tokens_per_example;
    r.loss = n == 0 ? 0.0 : loss_sum / static_cast<double>(n);
    if (batches() > 0 && sums.back() >= 0) r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
    return r;
  }
};

// The batches replica `replica` of `replicas` evaluates: b = replica, replica + replicas,
// ... Every replica runs as many forwards (a ZeRO 3 replica gathers its blocks with the
// others in each one): where it has no batch left, it repeats its last (or batch 0) and
// keeps nothing. f(b, keep) runs batch b's forward.
template <typename F>
void for_replica_batches(int64_t batches, int replica, int replicas, F&& f) {
  const int64_t rounds = (batches + replicas - 1) / replicas;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t b = round * replicas + replica;
    if (b < batches) {
      f(b, true);
    } else {
      f(std::max<int64_t>(b - replicas, 0), false);
    }
  }
}

}  // namespace

EvalResult evaluate(const nn::Model& model, const data::Examples& val, int64_t max_items, int64_t batch,
                    nn::ModelCtx* ctx) {
  std::unique_ptr<nn::ModelCtx> own;
  if (ctx == nullptr) {
    own = model.make_ctx();
    ctx = own.get();
  }
  BatchSums sums(val, max_items, batch);
  for (int64_t b = 0; b < sums.batches(); ++b) {
    const data::Batch x = val.batch(sums.items(b));
    const nn::EvalSums s = model.evaluate(x.inputs, x.targets, *ctx);
    sums.set(b, s.loss, s.correct);
  }
  return sums.figures(val.tokens_per_example());
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

// Validation split across the replicas: replica d evaluates batches d, d + dp, ... (each
// replica's ranks together: its pipeline stages in turn, its tensor-parallel pieces with the
// vocabulary-parallel loss, ZeRO 3 gathering a block at a time through the block hook), the
// rank that reports its replica's figures (the last stage's first piece) keeps them, and one
// sum over the world gives every rank every batch's figures (BatchSums: the bits of one rank
// evaluating all of them). Before, every replica evaluated every batch: dp times the work.
EvalResult MeshStep::evaluate(const data::Examples& val, int64_t max_items, int64_t batch) {
  MeshStep& m = *this;
  // The steps' own context (its arena keeps a micro-batch's memory); a teacher's targets
  // there are dropped, so that validation is the plain cross-entropy.
  if (!m.piped) m.model.loss_ctx(*m.ctx).distill = {};
  BatchSums sums(val, max_items, batch);
  const bool reports = m.mesh.last() && m.mesh.tp_index == 0;
  for_replica_batches(sums.batches(), m.mesh.dp_index, m.mesh.dp_size, [&](int64_t b, bool keep) {
    const data::Batch x = val.batch(sums.items(b));
    nn::EvalSums s;
    if (m.piped) {
      s.loss = m.pipe->forward_only(x.inputs, x.targets, m.config.t);
    } else {
      s = m.model.evaluate(x.inputs, x.targets, *m.ctx);
    }
    if (keep && reports) sums.set(b, s.loss, s.correct);
  });
  m.dp.release_gathered();
  if (m.mesh.tp > 1) m.mesh.seam->take_stats();  // the step's figures count the step's collectives only
  if (!sums.sums.empty())
    comm::all_reduce(m.world, {.output = sums.sums.data(), .count = sums.sums.size(), .dtype = DType::kF64});
  return sums.figures(val.tokens_per_example());
}

void MeshStep::load_optimizer(checkpoint::Checkpoint& ck) {
  optim::RangeState st = update.kept_state();  // in place, only what this rank keeps
  ck.load_optimizer(model.params(), st);
  update.set_steps(st.steps);
}

void MeshStep::set_tracer(StepTracer* tracer) {
  MeshStep& m = *this;
  m.tracer = tracer;
  trace_step_parts(tracer);
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
