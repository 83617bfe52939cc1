// Parameter servers (docs/parallelism.md, "Parameter servers"): server ranks each own a
// contiguous key range of the flat parameter buffer, with the optimizer state for it;
// worker ranks compute gradients, push them to every server and pull the new parameters.
//
// Links: one two-rank Communicator per (server, worker) pair, rank 0 the server, so that a
// worker's death breaks its links only. A server serves each link on a thread of its own;
// a worker talks to every server at once (each link's async ops run on that link's
// progress thread). The protocol is strictly alternating on each link: the worker sends a
// request (hello, push, goodbye), the server answers hello and push with a reply and the
// parameters of its range.
//
// Modes:
//   sync   every step waits for every worker's push; the server sums them in worker order
//          (exactly, in deterministic mode: the pushes are exact-sum limbs), clips by the
//          global norm (the servers sum their squares) and updates once. Equal to data
//          parallelism: bitwise in deterministic mode.
//   async  each push is applied on arrival (clipped by its worker) at the step's learning
//          rate / workers, and the reply carries the newest parameters.
//   ssp    as async, but the reply to a worker's push of its step t is held until every live
//          worker has pushed its step t - K (K = staleness): no worker runs more than K steps
//          ahead of the slowest. sync is ssp with K = 0 and one update per step.
// A "step" is one global batch: in async and ssp, `workers` pushes (each of global_batch /
// workers items); the run ends once the servers have applied steps x workers pushes, and
// the pushes already in flight then (at most workers - 1) are applied too, so that every
// server holds the same pushes whatever order they arrived in. Async and ssp drop a worker whose link fails (logged, training goes on);
// sync cannot go on without one and stops with an error naming it.
//
// Thread-safety: a ParamServer runs its threads inside serve(); the callbacks run on them,
// one at a time (under the server's lock). A PsWorker is driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/optim/optim.h"
#include "loom/core/params.h"

namespace loom::parallel {

enum class PsMode : uint8_t { kSync = 0, kAsync, kSsp };
PsMode ps_mode_named(const std::string& name);  // "sync" | "async" | "ssp"; InputError otherwise
std::string_view ps_mode_name(PsMode mode);

// Server s owns flat elements [bounds[s], bounds[s + 1]): `servers` contiguous ranges of
// near-equal bytes, cut at multiples of 16 elements (64 bytes) where the size allows.
std::vector<int64_t> ps_key_ranges(int64_t numel, int servers);

struct PsServerConfig {
  PsMode mode = PsMode::kSync;
  int64_t staleness = 0;       // ssp: K
  bool deterministic = false;  // sync: pushes are exact-sum limbs (parallel/exact_sum.h)
  int64_t workers = 1;         // pushes per step (async, ssp); sync: links per step
  int64_t start_step = 0;      // a resumed run's
  int64_t steps = 1;           // training.steps: the run ends after this many
  optim::ScheduleConfig schedule;
  double max_norm = 0;  // sync: clipping by the global norm (async, ssp: the workers clip)
};

// One step as a server saw it (a step of async and ssp: the last `workers` pushes).
struct PsStep {
  int64_t step = 0;  // 1-based, the steps done
  double loss = 0;   // the mean of the step's micro-batch losses (in worker order in sync)
  double lr = 0, grad_norm = 0;  // async, ssp: the mean of the pushes' norms
  int64_t pushes = 0;
  int64_t max_staleness = 0;       // updates applied between a push's pull and the push
  double mean_staleness = 0;
  int64_t max_queue = 0;           // pushes received and waiting for the update, at most
  double push_ms = 0, pull_ms = 0;  // as the workers measured their previous exchange, mean
  int64_t bytes = 0;        // payload bytes the step's pushing links moved to and from every
                            // server, as measured at their previous exchange
  int64_t local_bytes = 0;  // likewise, of the all-reduces summing each host's workers first
  double held_ms = 0;               // ssp: the longest a reply was held for the slowest worker
  std::vector<int64_t> staleness;   // per link: the staleness of its last push this step (-1: none)
};

class ParamServer {
 public:
  // links[w]: the pair communicator of worker link w (this server is its rank 0); servers:
  // the servers' group (its rank = this server's index). This server updates params over
  // [begin, end) (its values there are the run's start: random, or loaded). REQUIRES: every
  // communicator outlives this; params f32 and allocated.
  ParamServer(std::vector<comm::Communicator*> links, comm::Communicator& servers, ParamSet& params, int64_t begin,
              int64_t end, const optim::OptimizerConfig& optimizer, const PsServerConfig& config);
  ~ParamServer();
  ParamServer(const ParamServer&) = delete;
  ParamServer& operator=(const ParamServer&) = delete;

  // Called under the server's lock when a step completes (sync: on every server, in step
  // order, so it may run collectives over the servers' group; async and ssp: on each
  // server as its own count of pushes crosses a step) and when a link is dropped.
  void on_step(std::function<void(const PsStep&)> fn);
  void on_drop(std::function<void(int worker_rank, const std::string& why)> fn);  // its job rank

  // Serves every link until each has said goodbye or been dropped. RuntimeError naming the
  // worker when sync mode loses one, or when async or ssp lose them all before the end.
  void serve();

  // Async and ssp, while serving (any thread): serves a worker that joined the running job
  // on `link` (this server its rank 0) from now on; it says hello, pulls and pushes as the
  // others. Returns its link index, or -1 when the run is over (the caller closes the link).
  // REQUIRES: `link` outlives serve().
  int add_link(comm::Communicator* link);

  int64_t steps_done() const;
  // The optimizer state of [begin, end) (views), for checkpoints; and to load one into.
  optim::RangeState optimizer_state() const;
  void set_optimizer_steps(int64_t steps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a worker learns from one exchange with the servers.
struct PsReply {
  int64_t step = 0;  // the servers' steps done (server 0's)
  double loss = 0, lr = 0, grad_norm = 0;  // sync: the step's, from server 0
  bool stop = false;      // the run has reached its end: say goodbye
  bool applied = false;   // every server applied this push (sync: completed its round)
  int64_t staleness = 0;  // updates applied between this worker's last pull and its push (max over servers)
  double push_ms = 0;     // sending the gradients (until every server had them)
  double pull_ms = 0;     // from then until every server's parameters were in
  double held_ms = 0;     // ssp: the longest a server held the reply back
};

class PsWorker {
 public:
  // servers[s]: the pair communicator to server s (this worker is its rank 1); bounds as
  // ps_key_ranges. REQUIRES: params f32 and allocated; the communicators outlive this.
  PsWorker(std::vector<comm::Communicator*> servers, ParamSet& params, std::vector<int64_t> bounds, PsMode mode);
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  // The first pull: the servers' parameters into params.values(). `losses` is how many
  // micro-batch losses every push will carry.
  PsReply hello(int64_t losses);
  // Pushes a step's gradients and losses, then pulls the new parameters into params.values().
  struct Push {
    int64_t step = 0;
    Tensor grads;  // f32 over the flat layout, or in deterministic sync mode kLimbs int64
                   // exact-sum limbs per element
    std::vector<double> losses;  // its micro-batches' (the count given to hello)
    double grad_norm = 0;     // async, ssp: the norm this worker clipped by
    bool unsummable = false;  // deterministic: a gradient its exact sums cannot hold
    int64_t local_bytes = 0;  // bytes this worker's host all-reduce moved for the step
  };
  PsReply push_pull(const Push& push);
  // Tells every server this worker is done (after a reply with stop, or to leave early).
  void goodbye();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::parallel
