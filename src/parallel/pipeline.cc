// The pipeline executor (loom/parallel/pipeline.h): links, per-(micro-batch, chunk) contexts, and
// one loop over this stage's actions.
#include "loom/parallel/pipeline.h"

#include <chrono>
#include <map>

#include "loom/core/error.h"

namespace loom::parallel {

std::pair<int64_t, int64_t> chunk_blocks(int64_t n_layer, int stages, int virtual_stages, int stage, int chunk) {
  const int64_t parts = static_cast<int64_t>(stages) * virtual_stages;
  LOOM_CHECK_EQ(n_layer % parts, 0);
  const int64_t per = n_layer / parts, vs = static_cast<int64_t>(chunk) * stages + stage;
  return {vs * per, (vs + 1) * per};
}

nn::GptPart stage_part(int64_t n_layer, int stages, int virtual_stages, int stage) {
  nn::GptPart part{.all_blocks = false, .embeddings = stage == 0, .head = stage == stages - 1};
  for (int c = 0; c < virtual_stages; ++c) {
    auto [lo, hi] = chunk_blocks(n_layer, stages, virtual_stages, stage, c);
    for (int64_t l = lo; l < hi; ++l) part.blocks.push_back(l);
  }
  return part;
}

namespace {
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double ms_since_epoch(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t.time_since_epoch()).count();
}
}  // namespace

struct Pipeline::Impl {
  // One (micro-batch, chunk) in flight: its saved activations and transfer buffers.
  struct Slot {
    std::unique_ptr<nn::ModelCtx> ctx;  // made by the model
    Tensor input;    // received activation (B, T, C)
    Tensor grad_in;  // received d(output) (B, T, C)
    Tensor output;   // forward's output, while its send is in flight
    Tensor dx;       // backward's d(input), while its send is in flight
    comm::Work recv_act, recv_grad, send_act, send_grad;
    size_t recv_act_action = 0, recv_grad_action = 0;  // the receives' places in the list
    int actions_left = 0;  // of this (micro-batch, chunk) in the list; 0: it retires
  };

  comm::Communicator& pp;
  Schedule schedule;
  nn::Model& model;
  int stage = 0;
  // Links by direction: activations to the next stage / from the previous, gradients to
  // the previous / from the next.
  std::unique_ptr<comm::Communicator> act_out, act_in, grad_out, grad_in;
  std::vector<std::unique_ptr<Slot>> free_slots;
  std::vector<std::unique_ptr<Slot>> retiring;  // backward done, a send may be in flight
  std::map<std::pair<int, int>, std::unique_ptr<Slot>> live;
  std::map<std::pair<int, int>, int> actions_per_slot;  // from the list
  PipelineStats stats;

  std::vector<int> stage_ranks;
  std::function<void(const PipeSpan&)> observer;
  LossTargets loss_targets;
  size_t timed_count = 0;    // the message size transfer_ms was measured for
  double transfer_ms = 0;    // one activation or gradient to a neighbour, one way

  // Measures one transfer of `count` floats: each link pair (activations s -> s+1, gradients
  // back) bounces a message of that size, and a stage's figure is the mean one-way time of
  // its links, the best of a few rounds. Every op is async on its own link, so no order
  // between stages can deadlock. Collective over the pipeline.
  void measure_transfer(size_t count) {
    if (count == timed_count) return;
    std::vector<float> out(count), back(count), in(count);
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      const Clock::time_point t0 = Clock::now();
      comm::Work got, sent, reply, returned;
      if (act_in) got = comm::recv_async(*act_in, {.buffer = in.data(), .count = count, .peer = 0, .tag = kProbe});
      if (act_out) {
        sent = comm::send_async(*act_out, {.buffer = out.data(), .count = count, .peer = 1, .tag = kProbe});
        returned = comm::recv_async(*grad_in, {.buffer = back.data(), .count = count, .peer = 0, .tag = kProbe});
      }
      if (act_in) {
        got.wait();
        reply = comm::send_async(*grad_out, {.buffer = in.data(), .count = count, .peer = 1, .tag = kProbe});
      }
      sent.wait();
      returned.wait();
      reply.wait();
      best = std::min(best, ms_between(t0, Clock::now()));
    }
    // A stage with an outgoing link waited one round trip; the last stage of a plain
    // pipeline one arrival and one reply: halve either way.
    transfer_ms = best / 2;
    timed_count = count;
  }
  static constexpr uint32_t kProbe = 0xFFFFFFF0u;
  static constexpr uint32_t kForwardOnly = 0xFFFFFFF1u;  // evaluation's activations

  Impl(comm::Communicator& c, Schedule s, nn::Model& g, std::vector<int> r)
      : pp(c), schedule(std::move(s)), model(g), stage(c.rank()), stage_ranks(std::move(r)) {}

  std::string stage_name(int s) const {
    return stage_ranks.empty() ? cat("stage ", s) : cat("stage ", s, " (rank ", stage_ranks[s], ")");
  }

  // What an action moves, and with whom: for error messages.
  std::string describe(const PipeAction& a) const {
    const int p = schedule.stages, vs = schedule.virtual_stage(stage, a.chunk);
    const std::string mb = cat(" of micro-batch ", a.microbatch);
    switch (a.op) {
      case PipeOp::kRecvActivation:
      case PipeOp::kForward:
        return cat("activations", mb, " from ", stage_name((vs - 1 + p) % p));
      case PipeOp::kSendActivation: return cat("activations", mb, " to ", stage_name((vs + 1) % p));
      case PipeOp::kSendGrad: return cat("gradients", mb, " to ", stage_name((vs - 1 + p) % p));
      default: return cat("gradients", mb, " from ", stage_name((vs + 1) % p));
    }
  }

  // Every directed link becomes a two-rank communicator, made by splitting the pipeline
  // group in rounds where no rank is in two links: edge e (stage e -> e + 1, and back for
  // gradients) in round e % 2, the wrap-around edge of an odd ring in round 2.
  void make_links() {
    const int p = schedule.stages;
    const bool ring = schedule.virtual_stages > 1;
    const int edges = ring ? p : p - 1;
    for (bool act : {true, false})
      for (int round = 0; round < 3; ++round) {
        int color = -1, key = 0;
        for (int e = 0; e < edges; ++e) {
          const int r = (p % 2 == 1 && e == p - 1) ? 2 : e % 2;
          if (r != round) continue;
          const int lo = e, hi = (e + 1) % p;  // activations lo -> hi, gradients hi -> lo
          const int from = act ? lo : hi, to = act ? hi : lo;
          if (stage == from || stage == to) {
            color = e;
            key = stage == from ? 0 : 1;
          }
        }
        std::unique_ptr<comm::Communicator> link = pp.split(color, key);
        if (!link) continue;
        const bool sender = key == 0;
        (act ? (sender ? act_out : act_in) : (sender ? grad_out : grad_in)) = std::move(link);
      }
  }

  // A send's time in flight into the step's stats, once it is through; the handle released.
  void account_send(comm::Work& send) {
    if (!send.valid()) return;
    send.wait();
    const auto [begin, end] = send.span();
    stats.send_ms += ms_between(begin, end);
    send = comm::Work();
  }

  Slot& slot(int mb, int chunk) {
    auto& s = live[{mb, chunk}];
    if (s) return *s;
    // Reuse a retired slot whose sends are done (its arena keeps its memory).
    for (size_t i = 0; i < retiring.size(); ++i)
      if (retiring[i]->send_act.done() && retiring[i]->send_grad.done()) {
        account_send(retiring[i]->send_act);
        account_send(retiring[i]->send_grad);
        free_slots.push_back(std::move(retiring[i]));
        retiring.erase(retiring.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    if (!free_slots.empty()) {
      s = std::move(free_slots.back());
      free_slots.pop_back();
    } else {
      s = std::make_unique<Slot>();
      s->ctx = model.make_ctx();
    }
    s->actions_left = actions_per_slot.at({mb, chunk});
    stats.peak_in_flight = std::max(stats.peak_in_flight, static_cast<int>(live.size()));
    return *s;
  }

  // After each of its actions: when that was the last, the slot is reused once its sends
  // are through.
  void done_with(int mb, int chunk) {
    auto it = live.find({mb, chunk});
    if (--it->second->actions_left > 0) return;
    retiring.push_back(std::move(it->second));
    live.erase(it);
  }

  // What a compute action needs of the step.
  struct Compute {
    const Batch& batch;
    int64_t b, t;
    double scale;
    Piece piece;  // the action's
    const BackwardPieces& pieces;
  };

  // One compute action: a forward of micro-batch a.microbatch through this stage's chunk
  // a.chunk (the loss on the last virtual stage, into `losses`), its backward, or its weight
  // pass, each backward piece inside c.pieces.
  void compute(const PipeAction& a, Slot& x, Compute c, std::vector<double>& losses) {
    const Schedule& s = schedule;
    const bool first = s.first_virtual(stage, a.chunk), last = s.last_virtual(stage, a.chunk);
    const auto [lo, hi] = chunk_blocks(model.n_blocks(), s.stages, s.virtual_stages, stage, a.chunk);
    Piece& piece = c.piece;
    auto begin_piece = [&] {
      if (c.pieces.begin) c.pieces.begin(piece);
    };
    auto end_piece = [&] {
      if (c.pieces.end) c.pieces.end(piece);
    };
    switch (a.op) {
      case PipeOp::kForward: {
        model.begin(*x.ctx, c.b, c.t);
        Tensor in;
        std::pair<Tensor, Tensor> data;
        if (first || last) data = c.batch(a.microbatch);
        if (first) {
          in = model.embed(data.first, *x.ctx);
        } else {
          in = x.input;
        }
        Tensor h = model.forward_stage(lo, hi, in, *x.ctx);
        if (last) {
          if (loss_targets) loss_targets(data.first, model.loss_ctx(*x.ctx));
          losses[a.microbatch] = model.head(h, data.second, *x.ctx);
        } else {
          x.output = h;
        }
        break;
      }
      case PipeOp::kBackward:
      case PipeOp::kBackwardInput: {
        // The input gradients; kBackwardInput leaves the linear layers' and the head's
        // weight gradients to kBackwardWeight. Embedding gradients are taken here either way.
        const bool defer = a.op == PipeOp::kBackwardInput;
        Tensor dy;
        if (last) {  // the head's gradients are summed apart from the blocks' (as one process)
          const Pipeline::Piece blocks = piece;
          piece.final = false;  // the head's sums start with the blocks'
          begin_piece();
          dy = model.backward_head(*x.ctx, c.scale, defer);
          end_piece();
          piece = blocks;
        } else {
          dy = x.grad_in;
        }
        begin_piece();
        Tensor dx = model.backward_stage(lo, hi, dy, *x.ctx, defer);
        if (first) model.backward_embed(dx, *x.ctx);
        else x.dx = dx;
        end_piece();
        break;
      }
      case PipeOp::kBackwardWeight:
        begin_piece();
        model.backward_weights(lo, hi, last, *x.ctx);
        end_piece();
        break;
      default:
        LOOM_CHECK(false);  // not a compute action
    }
  }

  // The step's figures once its actions are done: its time, each action's overhead (neither
  // its compute nor its wait), and the simulator's per-stage costs (means per chunk action,
  // times the chunks). `began` has one more entry than the actions, set here.
  void finish_stats(Clock::time_point start, std::vector<Clock::time_point>& began, const std::vector<double>& waited,
                    const double (&op_ms)[4], const int (&op_count)[4]) {
    const size_t n_actions = waited.size();
    began[n_actions] = Clock::now();
    stats.step_ms = ms_between(start, began[n_actions]);
    stats.start_ms = ms_since_epoch(start);
    stats.action_overhead_ms.assign(n_actions, 0.0);
    for (size_t i = 0; i < n_actions; ++i)
      stats.action_overhead_ms[i] =
          std::max(0.0, ms_between(began[i], began[i + 1]) - waited[i] - stats.action_compute_ms[i]);
    // Means per chunk action, times v: the simulator's per-stage terms.
    auto mean = [&](int k) { return op_count[k] ? op_ms[k] / op_count[k] * schedule.virtual_stages : 0.0; };
    // What is neither compute nor waiting, spread over the stage's actions.
    const double overhead = std::max(0.0, stats.step_ms - stats.busy_ms - stats.wait_ms);
    stats.costs = {.forward_ms = mean(0), .backward_ms = mean(1) > 0 ? mean(1) : mean(2) + mean(3),
                   .backward_input_ms = mean(2), .backward_weight_ms = mean(3), .transfer_ms = transfer_ms,
                   .overhead_ms = overhead / static_cast<double>(std::max<size_t>(1, schedule.actions[stage].size()))};
  }

  static Tensor buffer(Tensor& t, const Shape& shape) {
    if (!t.defined() || t.shape() != shape) t = Tensor::zeros(shape, DType::kF32);
    return t;
  }
};

Pipeline::Pipeline(comm::Communicator& pp, Schedule schedule, nn::Model& model, std::vector<int> stage_ranks)
    : impl_(std::make_unique<Impl>(pp, std::move(schedule), model, std::move(stage_ranks))) {
  Impl& m = *impl_;
  LOOM_CHECK_EQ(m.schedule.stages, pp.size());
  LOOM_CHECK_EQ(check_schedule(m.schedule), "");
  LOOM_CHECK(m.schedule.stages > 1);
  m.make_links();
  for (const PipeAction& a : m.schedule.actions[m.stage]) ++m.actions_per_slot[{a.microbatch, a.chunk}];
}

Pipeline::~Pipeline() = default;

double Pipeline::forward_only(const Tensor& inputs, const Tensor& targets, int64_t t) {
  Impl& m = *impl_;
  const Schedule& s = m.schedule;
  const int p = s.stages, v = s.virtual_stages, st = m.stage;
  const int64_t b = inputs.dim(0);
  // A free slot's context (its arena keeps a training micro-batch's memory), or a new one.
  std::unique_ptr<Impl::Slot> slot;
  for (auto& r : m.retiring) {
    m.account_send(r->send_act);
    m.account_send(r->send_grad);
    m.free_slots.push_back(std::move(r));
  }
  m.retiring.clear();
  if (!m.free_slots.empty()) {
    slot = std::move(m.free_slots.back());
    m.free_slots.pop_back();
  } else {
    slot = std::make_unique<Impl::Slot>();
    slot->ctx = m.model.make_ctx();
  }
  nn::ModelCtx& ctx = *slot->ctx;
  const Shape shape = m.model.activation_shape(b, t);
  const auto count = static_cast<size_t>(shape_numel(shape));
  double loss = 0;
  m.model.begin(ctx, b, t);
  for (int chunk = 0; chunk < v; ++chunk) {
    const auto [lo, hi] = chunk_blocks(m.model.n_blocks(), p, v, st, chunk);
    Tensor x;
    if (s.first_virtual(st, chunk)) {
      x = m.model.embed(inputs, ctx);
    } else {
      x = Impl::buffer(slot->input, shape);
      comm::recv(*m.act_in, {.buffer = x.raw(), .count = count, .peer = 0, .tag = Impl::kForwardOnly});
    }
    const Tensor h = m.model.forward_stage(lo, hi, x, ctx);
    if (s.last_virtual(st, chunk)) {
      m.model.loss_ctx(ctx).distill = {};  // the plain cross-entropy (a training slot may hold a teacher's targets)
      loss = m.model.head(h, targets, ctx);
    }
    else comm::send(*m.act_out, {.buffer = h.raw(), .count = count, .peer = 1, .tag = Impl::kForwardOnly});
  }
  m.free_slots.push_back(std::move(slot));
  return loss;
}

const PipelineStats& Pipeline::stats() const { return impl_->stats; }
int Pipeline::stage() const { return impl_->stage; }
const Schedule& Pipeline::schedule() const { return impl_->schedule; }
void Pipeline::set_observer(std::function<void(const PipeSpan&)> observer) { impl_->observer = std::move(observer); }
void Pipeline::set_loss_targets(LossTargets targets) { impl_->loss_targets = std::move(targets); }

std::vector<double> Pipeline::run(const Batch& batch, int64_t b, int64_t t, double scale, const BackwardPieces& pieces) {
  Impl& m = *impl_;
  const Schedule& s = m.schedule;
  const int v = s.virtual_stages, st = m.stage;
  // Each chunk's last action adding to its gradients (a backward or weight pass of its last
  // micro-batch: passes run in ascending micro-batch order).
  std::vector<size_t> last_grad_action(static_cast<size_t>(v), 0);
  for (size_t i = 0; i < s.actions[st].size(); ++i)
    if (s.actions[st][i].op == PipeOp::kBackward || s.actions[st][i].op == PipeOp::kBackwardInput ||
        s.actions[st][i].op == PipeOp::kBackwardWeight)
      last_grad_action[static_cast<size_t>(s.actions[st][i].chunk)] = i;
  const int64_t n_layer = m.model.n_blocks();
  const Shape act_shape = m.model.activation_shape(b, t);  // sequence parallelism: this piece's rows
  const auto count = static_cast<size_t>(shape_numel(act_shape));
  std::vector<double> losses;
  if (st == s.stages - 1)  // holds the last virtual stage
    losses.assign(static_cast<size_t>(s.microbatches), 0.0);
  m.measure_transfer(count);
  m.stats = {};
  const Clock::time_point start = Clock::now();
  double op_ms[4] = {};  // forward, backward, backward input, backward weight: summed
  int op_count[4] = {};
  const PipeAction* current = nullptr;
  const size_t n_actions = s.actions[st].size();
  // Per action: when it began, its wait and its compute (for action_overhead_ms).
  std::vector<Clock::time_point> began(n_actions + 1);
  std::vector<double> waited(n_actions, 0.0);
  m.stats.action_compute_ms.assign(n_actions, 0.0);
  m.stats.action_begin_ms.assign(n_actions, 0.0);
  m.stats.action_landed_ms.assign(n_actions, 0.0);
  try {
    for (size_t i = 0; i < n_actions; ++i) {
      const PipeAction& a = s.actions[st][i];
      current = &a;
      began[i] = i == 0 ? start : Clock::now();
      const bool first = s.first_virtual(st, a.chunk), last = s.last_virtual(st, a.chunk);
      const auto [lo, hi] = chunk_blocks(n_layer, s.stages, v, st, a.chunk);
      const Piece piece{.final = i == last_grad_action[static_cast<size_t>(a.chunk)], .from_block = first ? -1 : lo};
      // A message's tag names it by micro-batch and the virtual stage that produced it.
      const int vs = s.virtual_stage(st, a.chunk), pv = s.stages * v;
      auto tag_of = [&](int producer) { return static_cast<uint32_t>(a.microbatch * pv + producer); };
      Impl::Slot& x = m.slot(a.microbatch, a.chunk);
      // Waiting for a neighbour is idle time, not compute.
      const Clock::time_point w0 = Clock::now();
      if (a.op == PipeOp::kForward && !first) {
        x.recv_act.wait();
        m.stats.action_landed_ms[x.recv_act_action] = ms_since_epoch(x.recv_act.span().second);
      }
      if ((a.op == PipeOp::kBackward || a.op == PipeOp::kBackwardInput) && !last) {
        x.recv_grad.wait();
        m.stats.action_landed_ms[x.recv_grad_action] = ms_since_epoch(x.recv_grad.span().second);
      }
      const Clock::time_point t0 = Clock::now();
      waited[i] = ms_between(w0, t0);
      m.stats.action_begin_ms[i] = ms_since_epoch(t0);
      m.stats.wait_ms += waited[i];
      if (m.observer && t0 - w0 > std::chrono::microseconds(20))
        m.observer({.what = "wait: " + m.describe(a), .compute = false, .begin = w0, .end = t0});
      switch (a.op) {
        case PipeOp::kRecvActivation:
          x.recv_act_action = i;
          x.recv_act = comm::recv_async(*m.act_in, {.buffer = Impl::buffer(x.input, act_shape).raw(), .count = count,
                                                    .peer = 0, .tag = tag_of(vs - 1)});
          break;
        case PipeOp::kRecvGrad:
          x.recv_grad_action = i;
          x.recv_grad = comm::recv_async(*m.grad_in, {.buffer = Impl::buffer(x.grad_in, act_shape).raw(), .count = count,
                                                      .peer = 0, .tag = tag_of(vs + 1)});
          break;
        case PipeOp::kSendActivation:
          x.send_act = comm::send_async(*m.act_out, {.buffer = x.output.raw(), .count = count, .peer = 1, .tag = tag_of(vs)});
          m.stats.sent_bytes += static_cast<int64_t>(count * sizeof(float));
          break;
        case PipeOp::kSendGrad:
          x.send_grad = comm::send_async(*m.grad_out, {.buffer = x.dx.raw(), .count = count, .peer = 1, .tag = tag_of(vs)});
          m.stats.sent_bytes += static_cast<int64_t>(count * sizeof(float));
          break;
        case PipeOp::kForward:
        case PipeOp::kBackward:
        case PipeOp::kBackwardInput:
        case PipeOp::kBackwardWeight:
          m.compute(a, x, {.batch = batch, .b = b, .t = t, .scale = scale, .piece = piece, .pieces = pieces}, losses);
          break;
      }
      if (pipe_op_computes(a.op)) {
        const Clock::time_point t1 = Clock::now();
        const double ms = ms_between(t0, t1);
        if (m.observer)
          m.observer({.what = cat(pipe_op_name(a.op), " mb ", a.microbatch, v > 1 ? cat(" chunk ", a.chunk) : std::string()),
                      .begin = t0, .end = t1});
        m.stats.busy_ms += ms;
        m.stats.action_compute_ms[i] = ms;
        const int k = a.op == PipeOp::kForward ? 0 : a.op == PipeOp::kBackward ? 1 : a.op == PipeOp::kBackwardInput ? 2 : 3;
        op_ms[k] += ms;
        ++op_count[k];
      }
      m.done_with(a.microbatch, a.chunk);
    }
    // Every send must be through before the buffers it reads are reused.
    current = nullptr;
    for (auto& r : m.retiring) {
      m.account_send(r->send_act);
      m.account_send(r->send_grad);
    }
  } catch (const comm::CommError& e) {
    throw RuntimeError(cat("pipeline stage ", st, ": ", current ? cat("moving ", m.describe(*current)) : "finishing its sends",
                           ": ", e.what()));
  }
  for (auto& r : m.retiring) m.free_slots.push_back(std::move(r));
  m.retiring.clear();
  LOOM_CHECK(m.live.empty());
  m.finish_stats(start, began, waited, op_ms, op_count);
  return losses;
}

}  // namespace loom::parallel
