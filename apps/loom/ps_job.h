// The parameter-server job's roles (ps_train.cc runs them; ps_serve.cc is the server's,
// the worker's is in ps_train.cc): the job's sizes and links, shared by both.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "config_train.h"
#include "loom/comm/comm.h"
#include "loom/core/error.h"
#include "loom/parallel/param_server.h"
#include "loom/comm/rendezvous.h"
#include "workload.h"

namespace loom::app::ps {

using Clock = std::chrono::steady_clock;

struct Job {
  const TrainConfig& t;
  int servers = 0, workers = 0;
  parallel::PsMode mode = parallel::PsMode::kSync;
  int64_t steps = 0, global_batch = 0, micro_batch = 0, per_worker = 0, accum = 0;
  uint64_t seed = 0;
  std::string run, ckpt_root;
  // The workers that talk to the servers, ascending: every worker, or with a host reduce
  // (sync, parallel.ps_hierarchical) the first worker on each host. Link l is leaders[l]'s.
  std::vector<int> leaders;
  comm::Store* store = nullptr;  // the job's
  std::vector<int64_t> trace_steps;  // [profile] trace_steps
  std::optional<Clock::time_point> trace_origin;  // every rank's, taken after a barrier
};

// Each rank of a traced run writes its events here; rank 0 merges them into trace.json.
inline std::string trace_part(const Job& job, int rank) {
  return (std::filesystem::path(job.run) / "logs" / cat("trace-rank", rank, ".json")).string();
}

// The store keys of workers that join a running job: "ps/joins" counts them, and joined
// worker k links to server s as "ps/<s>/j<k>"; "ps/layout" holds the world size and the
// layout every rank shares, for them to check theirs against.
inline constexpr const char* kJoins = "ps/joins";
inline constexpr const char* kLayout = "ps/layout";

// The pair communicators of this rank's links: a server's to every leader, a leader's to
// every server, each created in ascending order of the other end (no cycle of waits).
inline std::vector<std::unique_ptr<comm::Communicator>> make_links(const Job& job, comm::Communicator& world,
                                                                 comm::Store& store) {
  std::vector<std::unique_ptr<comm::Communicator>> links;
  const int me = world.rank();
  const bool server = me < job.servers;
  if (!server && std::find(job.leaders.begin(), job.leaders.end(), me) == job.leaders.end()) return links;
  for (int other = 0; other < (server ? static_cast<int>(job.leaders.size()) : job.servers); ++other) {
    const int s = server ? me : other, w = server ? job.leaders[other] : me;
    comm::CommConfig cfg = world.config();
    cfg.job_ranks = {s, w};
    links.push_back(comm::Communicator::create(store, server ? 0 : 1, 2, cfg, cat("ps/", s, "/", w)));
  }
  return links;
}

inline std::vector<comm::Communicator*> raw(const std::vector<std::unique_ptr<comm::Communicator>>& links) {
  std::vector<comm::Communicator*> out;
  for (const auto& l : links) out.push_back(l.get());
  return out;
}

// Server role: serves its range of the model to the workers, and on the first server writes
// the run directory (metrics, evaluations, checkpoints). Returns the exit code.
int serve(const Job& job, const TrainArgs& a, bool resume, Workload& task, comm::Communicator& world,
          comm::Communicator& group, std::vector<comm::Communicator*> links);

}  // namespace loom::app::ps
