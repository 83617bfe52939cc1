// Parameter servers, the server side: a thread per worker link, and the update of this
// server's key range in each mode (sync rounds, async and ssp pushes). The worker side is
// ps_worker.cc; the messages are ps_wire.h.
#include "loom/parallel/param_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "loom/core/error.h"
#include "parallel/exact_sum.h"
#include "parallel/ps_wire.h"

namespace loom::parallel {

using Clock = std::chrono::steady_clock;

PsMode ps_mode_named(const std::string& name) {
  if (name == "sync") return PsMode::kSync;
  if (name == "async") return PsMode::kAsync;
  if (name == "ssp") return PsMode::kSsp;
  throw InputError(cat("parameter-server mode \"", name, "\": expected sync, async or ssp"));
}

std::string_view ps_mode_name(PsMode mode) {
  switch (mode) {
    case PsMode::kSync: return "sync";
    case PsMode::kAsync: return "async";
    case PsMode::kSsp: return "ssp";
  }
  return "?";
}

std::vector<int64_t> ps_key_ranges(int64_t numel, int servers) {
  LOOM_CHECK_LE(1, servers);
  std::vector<int64_t> bounds(static_cast<size_t>(servers) + 1, 0);
  for (int s = 1; s < servers; ++s) {
    const int64_t even = static_cast<int64_t>(static_cast<__int128>(numel) * s / servers);
    bounds[s] = std::clamp((even + 8) / 16 * 16, bounds[s - 1], numel);  // the nearest multiple of 16
  }
  bounds[servers] = numel;
  return bounds;
}

struct ParamServer::Impl {
  struct Link {
    comm::Communicator* comm = nullptr;
    int64_t losses_per_push = 0;
    ps::Request request;
    std::vector<double> losses;
    Tensor grads;  // the push just received: f32, or limbs in deterministic sync mode
    Tensor out;    // async, ssp: the parameters it pulls, copied under the lock
    int64_t clock = 0;  // the step it pushes next
    int64_t seen = 0;   // updates applied when it last pulled
    enum class State { kActive, kDone, kDropped } state = State::kActive;
  };

  std::deque<Link> links;  // grows while serving (joined workers); references stay valid
  comm::Communicator& servers;
  ParamSet& params;
  int64_t begin, end;
  PsServerConfig config;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::function<void(const PsStep&)> step_fn;
  std::function<void(int, const std::string&)> drop_fn;

  std::mutex mu;
  std::condition_variable cv;
  int64_t steps_done = 0;
  int64_t applied = 0;  // updates applied (sync: rounds)
  int64_t queued = 0;   // pushes received, not yet applied
  int64_t arrived = 0;  // sync: pushes of the round under way
  ps::Reply round;      // sync: the last round's reply
  std::string failure;  // why serving stopped early
  std::vector<std::thread> threads;  // one per link
  bool closed = false;               // serve() is done: no link may join
  Tensor exact;         // deterministic: the round's limbs
  PsStep window;        // the step being accumulated
  double loss_sum = 0, norm_sum = 0, push_sum = 0, pull_sum = 0, staleness_sum = 0;
  int64_t loss_count = 0, timed = 0;

  Impl(std::vector<comm::Communicator*> l, comm::Communicator& s, ParamSet& p, int64_t b, int64_t e,
       const PsServerConfig& c)
      : servers(s), params(p), begin(b), end(e), config(c) {
    for (comm::Communicator* comm : l) links.push_back(Link{.comm = comm, .clock = c.start_step});
    steps_done = c.start_step;
    reset_window();
  }

  int64_t n() const { return end - begin; }
  bool sync() const { return config.mode == PsMode::kSync; }
  bool exact_pushes() const { return sync() && config.deterministic; }
  int64_t budget() const { return (config.steps - config.start_step) * (sync() ? 1 : config.workers); }
  bool finished() const { return applied >= budget() || !failure.empty(); }
  std::string who(int l) const {
    return cat("worker rank ", links[l].comm->config().job_rank(1), " (link ", l, ")");
  }

  void reset_window() {
    window = PsStep{.staleness = std::vector<int64_t>(links.size(), -1)};
    loss_sum = norm_sum = push_sum = pull_sum = staleness_sum = 0;
    loss_count = timed = 0;
  }

  // Under the lock: a push's figures into the step being accumulated.
  void note_push(int l, int64_t staleness) {
    const Link& k = links[l];
    for (double x : k.losses) loss_sum += x;
    loss_count += static_cast<int64_t>(k.losses.size());
    norm_sum += k.request.grad_norm;
    if (k.request.push_ms > 0 || k.request.pull_ms > 0) {
      push_sum += k.request.push_ms;
      pull_sum += k.request.pull_ms;
      ++timed;
    }
    window.bytes += k.request.bytes;
    window.local_bytes += k.request.local_bytes;
    window.pushes++;
    window.max_staleness = std::max(window.max_staleness, staleness);
    staleness_sum += static_cast<double>(staleness);
    window.staleness[l] = staleness;
  }

  // Under the lock: the step is complete; report it and start the next.
  void emit(double lr, double grad_norm) {
    window.step = steps_done;
    window.loss = loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0;
    window.lr = lr;
    window.grad_norm = grad_norm;
    window.mean_staleness = window.pushes > 0 ? staleness_sum / static_cast<double>(window.pushes) : 0;
    window.push_ms = timed > 0 ? push_sum / static_cast<double>(timed) : 0;
    window.pull_ms = timed > 0 ? pull_sum / static_cast<double>(timed) : 0;
    if (step_fn) {
      try {
        step_fn(window);
      } catch (const std::exception& e) {
        failure = cat("step ", steps_done, ": ", e.what());
      }
    }
    reset_window();
  }

  // Under the lock, by the last push of a sync round: sum, clip, update.
  void apply_round() {
    float* g = params.grads().data<float>() + begin;
    bool unsummable = false;
    for (const Link& k : links) unsummable = unsummable || k.request.unsummable != 0;
    if (exact_pushes()) {
      exact.zero();
      int64_t* acc = exact.data<int64_t>();
      for (const Link& k : links) {
        const int64_t* x = k.grads.data<int64_t>();
        for (int64_t i = 0; i < kLimbs * n(); ++i) acc[i] += x[i];  // integers: any order, the same sum
      }
      exact_decode(acc, g, n());
    } else {
      std::copy_n(links[0].grads.data<float>(), n(), g);
      for (size_t l = 1; l < links.size(); ++l) {
        const float* x = links[l].grads.data<float>();
        for (int64_t i = 0; i < n(); ++i) g[i] += x[i];  // in worker order
      }
    }
    double norm = 0;
    if (config.deterministic) {
      int64_t sq[kSquareLimbs + 1] = {};
      exact_accumulate_squares(g, n(), sq);
      sq[kSquareLimbs] = unsummable ? 1 : 0;
      comm::all_reduce(servers, {.output = sq, .count = kSquareLimbs + 1, .dtype = DType::kI64});
      norm = sq[kSquareLimbs] > 0 ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(exact_decode_squares(sq));
    } else {
      double sq = 0;
      for (int64_t i = 0; i < n(); ++i) sq += static_cast<double>(g[i]) * g[i];
      comm::all_reduce(servers, {.output = &sq, .count = 1, .dtype = DType::kF64});
      norm = std::sqrt(sq);
    }
    if (config.max_norm > 0 && std::isfinite(norm) && norm > config.max_norm) {
      const auto coef = static_cast<float>(config.max_norm / (norm + 1e-6));  // as optim::clip_grad_norm
      for (int64_t i = 0; i < n(); ++i) g[i] *= coef;
    }
    for (size_t l = 0; l < links.size(); ++l) note_push(static_cast<int>(l), 0);
    const double lr = optim::lr_at(config.schedule, steps_done);
    const double loss = loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0;
    if (!std::isfinite(norm) || !std::isfinite(loss)) {
      failure = cat("step ", steps_done + 1, ": the loss (", loss, ") or the gradient norm (", norm,
                    ") is not finite; the run stops before updating (a lower training.lr or a training.grad_clip "
                    "may help)");
    } else {
      optimizer->step(lr);
      ++steps_done;
      ++applied;
    }
    queued = 0;  // (its peak was noted as each push came)
    round = {.step = steps_done, .applied = failure.empty() ? 1 : 0, .loss = loss, .lr = lr, .grad_norm = norm};
    if (failure.empty()) emit(lr, norm);
    round.stop = finished() ? 1 : 0;
    arrived = 0;
  }

  // Under the lock: one async or ssp push, applied now.
  void apply_push(int l, ps::Reply& reply) {
    Link& k = links[l];
    const int64_t staleness = applied - k.seen;
    std::copy_n(k.grads.data<float>(), n(), params.grads().data<float>() + begin);
    // Each push moves the parameters a workers-th of a step's way: with plain SGD and no
    // staleness, the step's pushes together make exactly sync's update (its gradient is the
    // mean of theirs); with Adam, a step's pushes move as far as sync's one update.
    const double lr = optim::lr_at(config.schedule, config.start_step + applied / config.workers) /
                      static_cast<double>(config.workers);
    optimizer->step(lr);
    ++applied;
    --queued;
    note_push(l, staleness);
    if (applied % config.workers == 0) {
      steps_done = config.start_step + applied / config.workers;
      emit(lr, norm_sum / static_cast<double>(std::max<int64_t>(window.pushes, 1)));
    }
    double loss = 0;
    for (double x : k.losses) loss += x;
    reply = {.step = steps_done, .applied = 1, .staleness = staleness,
             .loss = k.losses.empty() ? 0 : loss / static_cast<double>(k.losses.size()), .lr = lr,
             .grad_norm = k.request.grad_norm};
  }

  // ssp: may the worker that pushed step t start step t + 1? When every live worker has
  // pushed step t - K.
  bool may_go_on(int64_t t) const {
    if (config.mode != PsMode::kSsp || finished()) return true;
    for (const Link& k : links)
      if (k.state == Link::State::kActive && k.clock < t - config.staleness + 1) return false;
    return true;
  }

  void send_reply(Link& k, const ps::Reply& reply, const float* values) {
    comm::send(*k.comm, {.buffer = &reply, .count = sizeof reply, .dtype = DType::kU8, .peer = 1, .tag = ps::kReply});
    comm::send(*k.comm, {.buffer = values, .count = static_cast<size_t>(n()), .dtype = DType::kF32, .peer = 1,
                         .tag = ps::kParams});
  }

  // The parameters a reply carries: sync sends them in place (no update can start before
  // this worker pushes again); async and ssp copy them under the lock.
  const float* snapshot(Link& k) {
    const float* v = params.values().data<float>() + begin;
    if (sync()) return v;
    std::copy_n(v, n(), k.out.data<float>());
    return k.out.data<float>();
  }

  void receive(Link& k) {
    comm::recv(*k.comm, {.buffer = &k.request, .count = sizeof k.request, .dtype = DType::kU8, .peer = 1,
                         .tag = ps::kRequest});
    if (k.request.kind != ps::Kind::kPush) return;
    comm::recv(*k.comm, {.buffer = k.losses.data(), .count = k.losses.size(), .dtype = DType::kF64, .peer = 1,
                         .tag = ps::kLosses});
    comm::recv(*k.comm, {.buffer = k.grads.raw(), .count = static_cast<size_t>(k.grads.numel()),
                         .dtype = k.grads.dtype(), .peer = 1, .tag = ps::kGradients});
  }

  void serve_link(int l) {
    Link& k = links[l];
    try {
      receive(k);
      if (k.request.kind != ps::Kind::kHello)
        throw RuntimeError(cat(who(l), " opened with message kind ", static_cast<int64_t>(k.request.kind), ", not hello"));
      if (k.request.losses < 0 || k.request.losses > (int64_t{1} << 24))
        throw RuntimeError(cat(who(l), " announced ", k.request.losses, " losses per push"));
      k.losses.assign(static_cast<size_t>(k.request.losses), 0.0);
      k.grads = Tensor::zeros({exact_pushes() ? kLimbs * n() : n()}, exact_pushes() ? DType::kI64 : DType::kF32);
      if (!sync()) k.out = Tensor::zeros({n()}, DType::kF32);
      ps::Reply reply;
      const float* values = nullptr;
      {
        std::lock_guard lock(mu);
        k.seen = applied;
        // The step it starts from: its clock (the run's first step, or for a worker that
        // joined, the servers' step when it did), however late its hello comes.
        reply = {.step = k.clock, .stop = finished() ? 1 : 0};
        values = snapshot(k);
      }
      send_reply(k, reply, values);
      for (;;) {
        receive(k);
        if (k.request.kind == ps::Kind::kGoodbye) {
          std::lock_guard lock(mu);
          k.state = Link::State::kDone;
          cv.notify_all();
          return;
        }
        if (k.request.kind != ps::Kind::kPush)
          throw RuntimeError(cat(who(l), " sent message kind ", static_cast<int64_t>(k.request.kind)));
        std::unique_lock lock(mu);
        ++queued;
        window.max_queue = std::max(window.max_queue, queued);
        if (sync()) {
          if (failure.empty() && k.request.step != steps_done)
            failure = cat(who(l), " pushed step ", k.request.step + 1, " while the servers are at step ", steps_done + 1);
          if (failure.empty()) {
            const int64_t my_round = applied;
            if (++arrived == static_cast<int64_t>(links.size())) {
              apply_round();
              cv.notify_all();
            } else {
              cv.wait(lock, [&] { return applied > my_round || !failure.empty(); });
            }
          }
          reply = round;
          if (!failure.empty()) reply = {.step = steps_done, .stop = 2, .grad_norm = std::nan("")};
        } else if (!failure.empty()) {
          --queued;
          reply = {.step = steps_done, .stop = 2};
        } else {
          // Every push that arrives is applied, even past the run's end (a push already in
          // flight when another made the last step): each server then holds every push it
          // acknowledged, whatever order they reached the servers in.
          apply_push(l, reply);
          k.clock = k.request.step + 1;
          cv.notify_all();
          const auto held_from = Clock::now();
          cv.wait(lock, [&] { return may_go_on(k.request.step); });
          reply.held_ms = std::chrono::duration<double, std::milli>(Clock::now() - held_from).count();
          window.held_ms = std::max(window.held_ms, reply.held_ms);
          reply.stop = finished() ? (failure.empty() ? 1 : 2) : 0;
        }
        k.seen = applied;
        values = snapshot(k);
        lock.unlock();
        send_reply(k, reply, values);
      }
    } catch (const Error& e) {
      std::lock_guard lock(mu);
      k.state = Link::State::kDropped;
      if (sync()) {
        if (failure.empty()) failure = cat(who(l), " failed: ", e.what(), "; synchronous training cannot go on without it");
      } else if (drop_fn) {
        drop_fn(k.comm->config().job_rank(1), e.what());
      }
      cv.notify_all();
    }
  }
};

ParamServer::ParamServer(std::vector<comm::Communicator*> links, comm::Communicator& servers, ParamSet& params,
                         int64_t begin, int64_t end, const optim::OptimizerConfig& optimizer,
                         const PsServerConfig& config)
    : impl_(std::make_unique<Impl>(std::move(links), servers, params, begin, end, config)) {
  Impl& m = *impl_;
  LOOM_CHECK(params.values().defined() && params.dtype() == DType::kF32);
  LOOM_CHECK(0 <= begin && begin <= end && end <= params.numel());
  LOOM_CHECK(!m.links.empty() && config.workers >= 1 && config.steps >= config.start_step);
  LOOM_CHECK(!(config.deterministic && config.mode != PsMode::kSync));
  // This range's pieces of every parameter, state in a buffer of the range's size.
  optim::UpdateSpec spec{.values = params.values(), .grads = params.grads(), .state_numel = end - begin};
  for (const ParamInfo& p : params.infos()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo < hi)
      spec.segments.push_back({.kind = p.kind, .numel = hi - lo, .value_offset = lo, .grad_offset = lo,
                               .state_offset = lo - begin});
  }
  m.optimizer = optim::make_optimizer(optimizer, spec);
  if (m.exact_pushes()) m.exact = Tensor::zeros({kLimbs * (end - begin)}, DType::kI64);
}

ParamServer::~ParamServer() = default;

void ParamServer::on_step(std::function<void(const PsStep&)> fn) { impl_->step_fn = std::move(fn); }
void ParamServer::on_drop(std::function<void(int, const std::string&)> fn) { impl_->drop_fn = std::move(fn); }

void ParamServer::serve() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    for (size_t l = 0; l < m.links.size(); ++l)
      m.threads.emplace_back([&m, l] { m.serve_link(static_cast<int>(l)); });
  }
  // Joins every link's thread, including those of links added meanwhile.
  for (size_t i = 0;; ++i) {
    std::thread t;
    {
      std::lock_guard lock(m.mu);
      if (i == m.threads.size()) {
        m.closed = true;
        break;
      }
      t = std::move(m.threads[i]);
    }
    t.join();
  }
  if (!m.failure.empty()) throw RuntimeError(m.failure);
  if (m.applied < m.budget())
    throw RuntimeError(cat("every worker is gone after ", m.steps_done, " of ", m.config.steps,
                           " steps; the servers stop (--resume continues from the last checkpoint)"));
}

int ParamServer::add_link(comm::Communicator* link) {
  Impl& m = *impl_;
  LOOM_CHECK(m.config.mode != PsMode::kSync);
  std::lock_guard lock(m.mu);
  if (m.closed || m.finished()) return -1;
  const auto l = static_cast<int>(m.links.size());
  // It starts at the servers' step: ssp waits for it from there on.
  m.links.push_back(Impl::Link{.comm = link, .clock = m.steps_done});
  m.window.staleness.push_back(-1);
  m.threads.emplace_back([&m, l] { m.serve_link(l); });
  return l;
}

int64_t ParamServer::steps_done() const { return impl_->steps_done; }

optim::RangeState ParamServer::optimizer_state() const {
  const Impl& m = *impl_;
  optim::RangeState s{.ranges = {{m.begin, m.end}}, .steps = m.optimizer->steps()};
  for (const auto& [name, t] : m.optimizer->state()) s.buffers.push_back({name, {t}});
  return s;
}

void ParamServer::set_optimizer_steps(int64_t steps) { impl_->optimizer->set_steps(steps); }

}  // namespace loom::parallel
