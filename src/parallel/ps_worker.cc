// Parameter servers, the worker side: each exchange goes to every server at once (each
// link's ops run on its own progress thread), the gradients of a server's range out and
// that range's parameters straight back into params.values().
#include <algorithm>
#include <chrono>
#include <cmath>

#include "loom/core/error.h"
#include "loom/parallel/param_server.h"
#include "parallel/exact_sum.h"
#include "parallel/ps_wire.h"

namespace loom::parallel {

using Clock = std::chrono::steady_clock;

struct PsWorker::Impl {
  std::vector<comm::Communicator*> servers;
  ParamSet& params;
  std::vector<int64_t> bounds;
  PsMode mode;
  std::vector<ps::Request> requests;  // alive until their sends complete
  std::vector<ps::Reply> replies;
  double last_push_ms = 0, last_pull_ms = 0;
  int64_t last_bytes = 0;

  int size() const { return static_cast<int>(servers.size()); }
  std::string who(int s) const { return cat("parameter server rank ", servers[s]->config().job_rank(0)); }

  // The servers' replies and parameters; after `sent` (the sends of this exchange).
  PsReply collect(std::vector<comm::Work>& sent, Clock::time_point t0) {
    std::vector<comm::Work> got;
    float* values = params.values().data<float>();
    for (int s = 0; s < size(); ++s) {
      comm::Communicator& c = *servers[s];
      // A reply may be held for the slowest worker (ssp) or for the round (sync): twice the
      // usual deadline, so that the server names a silent worker before this one gives up.
      const auto timeout = 2 * c.config().timeout;
      got.push_back(comm::recv_async(c, {.buffer = &replies[s], .count = sizeof(ps::Reply), .dtype = DType::kU8,
                                         .peer = 0, .tag = ps::kReply, .timeout = timeout}));
      got.push_back(comm::recv_async(c, {.buffer = values + bounds[s], .count = static_cast<size_t>(bounds[s + 1] - bounds[s]),
                                         .dtype = DType::kF32, .peer = 0, .tag = ps::kParams, .timeout = timeout}));
    }
    for (comm::Work& w : sent) w.wait();
    const auto t1 = Clock::now();
    for (comm::Work& w : got) w.wait();
    const auto t2 = Clock::now();
    PsReply r;
    r.push_ms = last_push_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    r.pull_ms = last_pull_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    const ps::Reply& first = replies[0];
    r.step = first.step;
    r.loss = first.loss;
    r.lr = first.lr;
    r.grad_norm = first.grad_norm;
    r.applied = true;
    for (int s = 0; s < size(); ++s) {
      r.applied = r.applied && replies[s].applied != 0;
      if (replies[s].stop == 2)
        throw RuntimeError(cat("the parameter servers stopped the run (", who(s), " says why in its log)"));
      r.stop = r.stop || replies[s].stop != 0;
      r.staleness = std::max(r.staleness, replies[s].staleness);
      r.held_ms = std::max(r.held_ms, replies[s].held_ms);
    }
    return r;
  }

  std::vector<comm::Work> send_requests() {
    std::vector<comm::Work> sent;
    for (int s = 0; s < size(); ++s)
      sent.push_back(comm::send_async(*servers[s], {.buffer = &requests[s], .count = sizeof(ps::Request),
                                                    .dtype = DType::kU8, .peer = 0, .tag = ps::kRequest}));
    return sent;
  }
};

PsWorker::PsWorker(std::vector<comm::Communicator*> servers, ParamSet& params, std::vector<int64_t> bounds, PsMode mode)
    : impl_(std::make_unique<Impl>(Impl{.servers = std::move(servers), .params = params, .bounds = std::move(bounds),
                                        .mode = mode})) {
  Impl& m = *impl_;
  LOOM_CHECK(params.values().defined() && params.dtype() == DType::kF32);
  LOOM_CHECK_EQ(m.bounds.size(), m.servers.size() + 1);
  LOOM_CHECK(m.bounds.front() == 0 && m.bounds.back() == params.numel());
  m.requests.resize(m.servers.size());
  m.replies.resize(m.servers.size());
}

PsWorker::~PsWorker() = default;

PsReply PsWorker::hello(int64_t losses) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  for (ps::Request& r : m.requests) r = {.kind = ps::Kind::kHello, .losses = losses};
  std::vector<comm::Work> sent = m.send_requests();
  return m.collect(sent, t0);
}

PsReply PsWorker::push_pull(const Push& push) {
  Impl& m = *impl_;
  const Tensor& grads = push.grads;
  const bool exact = grads.dtype() == DType::kI64;
  LOOM_CHECK_EQ(grads.numel(), (exact ? kLimbs : 1) * m.params.numel());
  const auto t0 = Clock::now();
  for (ps::Request& r : m.requests)
    r = {.kind = ps::Kind::kPush, .step = push.step, .unsummable = push.unsummable ? 1 : 0, .grad_norm = push.grad_norm,
         .push_ms = m.last_push_ms, .pull_ms = m.last_pull_ms, .bytes = m.last_bytes, .local_bytes = push.local_bytes};
  std::vector<comm::Work> sent = m.send_requests();
  const int64_t per = exact ? kLimbs : 1, es = static_cast<int64_t>(dtype_size(grads.dtype()));
  int64_t bytes = 0;
  for (int s = 0; s < m.size(); ++s) {
    comm::Communicator& c = *m.servers[s];
    sent.push_back(comm::send_async(c, {.buffer = push.losses.data(), .count = push.losses.size(), .dtype = DType::kF64,
                                        .peer = 0, .tag = ps::kLosses}));
    const int64_t count = per * (m.bounds[s + 1] - m.bounds[s]);
    sent.push_back(comm::send_async(c, {.buffer = static_cast<const char*>(grads.raw()) + per * m.bounds[s] * es,
                                        .count = static_cast<size_t>(count), .dtype = grads.dtype(), .peer = 0,
                                        .tag = ps::kGradients}));
    bytes += count * es + static_cast<int64_t>(push.losses.size() * sizeof(double) + sizeof(ps::Request) + sizeof(ps::Reply)) +
             (m.bounds[s + 1] - m.bounds[s]) * static_cast<int64_t>(sizeof(float));
  }
  PsReply r = m.collect(sent, t0);
  m.last_bytes = bytes;
  return r;
}

void PsWorker::goodbye() {
  Impl& m = *impl_;
  for (ps::Request& r : m.requests) r = {.kind = ps::Kind::kGoodbye};
  for (comm::Work& w : m.send_requests()) w.wait();
}

}  // namespace loom::parallel
