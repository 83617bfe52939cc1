// A parameter-server job (docs/parallelism.md, "Parameter servers"): ranks 0..S-1 serve
// key ranges of the model, the others are workers. PsJob is one rank's view of the job's
// roles and links: which workers talk to the servers (every worker, or with a host reduce
// the first worker on each host), the servers' group, a host's workers' group, and this
// rank's pair communicators to the other end. Workers that join a running async or ssp job
// (`loom train --ps-join`) get the same view with links of their own.
//
// The worker's step is a strategy of parallelize() (parallelize_ps_worker, parallelize.h);
// the server's is ParamServer (param_server.h), with PsJoinPoller serving joined workers and
// gather_ps_ranges / ps_server_share for evaluations and checkpoints.
//
// Thread-safety: one thread builds and uses a PsJob; PsJoinPoller runs a thread of its own.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/comm/rendezvous.h"
#include "loom/core/params.h"
#include "loom/parallel/checkpointing.h"
#include "loom/parallel/param_server.h"

namespace loom::parallel {

struct PsJobConfig {
  int servers = 1;
  PsMode mode = PsMode::kSync;
  // Whether a host's workers sum first and one of them talks to the servers (sync only):
  // "on", "off", or "auto" (when they are several and some server is on another host).
  std::string hierarchical = "auto";
};

class PsJob {
 public:
  // Every rank of the job: learns which host each rank is on, then splits the servers' and
  // the hosts' groups and links this rank. Collective over `world`; the links go through
  // `store` (keys "ps/<server>/<worker>"). Rank 0 publishes the world size and `layout`
  // (kPsLayout) for workers that join later.
  static PsJob join(comm::Communicator& world, comm::Store& store, const PsJobConfig& config, const std::string& layout);
  // A worker joining the running async or ssp job whose store is `store`, of `world` ranks:
  // it becomes rank world + k (k: how many joined before it) and takes the data shard of
  // worker k % workers, the one it most likely replaces. `comm` gives the transport, timeout
  // and job credentials of its links.
  static PsJob join_running(comm::Store& store, int world, const PsJobConfig& config, const comm::CommConfig& comm);

  PsJob(PsJob&&) noexcept;
  PsJob& operator=(PsJob&&) noexcept;
  ~PsJob();

  bool server() const { return rank_ < config_.servers; }
  int rank() const { return rank_; }            // in the job (a joined worker: world + k)
  int world() const { return world_; }          // the job's ranks at its start
  int servers() const { return config_.servers; }
  int workers() const { return world_ - config_.servers; }
  int worker() const { return worker_; }        // this worker's data shard; -1 on a server
  PsMode mode() const { return config_.mode; }
  const std::vector<int>& leaders() const { return leaders_; }  // the workers with links, ascending
  // A server: the servers' group (its rank = the server's index). REQUIRES: server().
  comm::Communicator& servers_group();
  // A worker: its host's workers that sum first (itself alone when they do not).
  comm::Communicator& host_workers();
  // This rank's links: a server's to every leader, a leader's to every server; none for a
  // worker whose host's leader talks for it.
  std::vector<comm::Communicator*> links() const;
  // The servers' key ranges of a model of `numel` elements (ps_key_ranges).
  std::vector<int64_t> bounds(int64_t numel) const { return ps_key_ranges(numel, config_.servers); }
  comm::Store& store() { return *store_; }

 private:
  PsJob() = default;
  PsJobConfig config_;
  int rank_ = 0, world_ = 0, worker_ = -1;
  std::vector<int> leaders_;
  comm::Store* store_ = nullptr;
  std::unique_ptr<comm::Communicator> group_, local_;
  std::unique_ptr<comm::HashStore> own_store_;  // a joined worker's group of one
  std::vector<std::unique_ptr<comm::Communicator>> links_;
};

// The store keys of workers that join a running job: kPsJoins counts them, and joined
// worker k links to server s as "ps/<s>/j<k>"; kPsLayout holds the world size and the
// layout every rank shares, for them to check theirs against.
inline constexpr const char* kPsJoins = "ps/joins";
inline constexpr const char* kPsLayout = "ps/layout";

// Async and ssp, on a server while it serves: links each worker that announces itself in
// the job's store (loom train --ps-join) and hands it to `server`. Stops in its destructor.
class PsJoinPoller {
 public:
  PsJoinPoller(PsJob& job, ParamServer& server);
  ~PsJoinPoller();
  PsJoinPoller(const PsJoinPoller&) = delete;
  PsJoinPoller& operator=(const PsJoinPoller&) = delete;

 private:
  void poll();
  PsJob& job_;
  ParamServer& server_;
  std::atomic<bool> serving_{true};
  std::vector<std::unique_ptr<comm::Communicator>> joined_;
  std::thread thread_;
};

// Every server's range into the first server's params.values(). Collective over the servers.
void gather_ps_ranges(comm::Communicator& servers, ParamSet& params, const std::vector<int64_t>& bounds);

// A server's share of a checkpoint: its range [begin, end) of the parameters and its
// optimizer state.
RankShare ps_server_share(const ParamSet& params, const ParamServer& server, int64_t begin, int64_t end);

}  // namespace loom::parallel
