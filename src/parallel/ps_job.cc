#include "loom/parallel/ps_job.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "loom/checkpoint/tensor_pieces.h"
#include "loom/core/error.h"
#include "loom/core/log.h"

namespace loom::parallel {

PsJob::PsJob(PsJob&&) noexcept = default;
PsJob& PsJob::operator=(PsJob&&) noexcept = default;
PsJob::~PsJob() = default;

PsJob PsJob::join(comm::Communicator& world, comm::Store& store, const PsJobConfig& config, const std::string& layout) {
  PsJob job;
  job.config_ = config;
  job.rank_ = world.rank();
  job.world_ = world.size();
  job.store_ = &store;
  const bool server = job.server();
  job.worker_ = server ? -1 : job.rank_ - config.servers;
  if (job.rank_ == 0)
    store.set(kPsLayout, cat(world.size(), "\n", layout), comm::Clock::now() + world.config().timeout);
  // Which host each rank is on (its first rank there); in sync mode the workers of a host
  // sum their gradients first and one of them talks to the servers, as BytePS does.
  int host = world.local_ranks().front();
  std::vector<int> hosts(static_cast<size_t>(world.size()));
  comm::all_gather(world, {.input = &host, .output = hosts.data(), .count = 1, .dtype = DType::kI32});
  // A host's workers sum first (sync only) when asked ("on"), or ("auto") when they are
  // several and some server is on another host: their links then cross the network, and one
  // push per host saves it the others'. On one host the links are shared memory already.
  const std::string& how = config.hierarchical;
  auto grouped = [&](int h) {
    if (config.mode != PsMode::kSync || how == "off") return false;
    if (how == "on") return true;
    int workers_here = 0;
    bool server_elsewhere = false;
    for (int r = 0; r < world.size(); ++r) {
      if (r < config.servers) server_elsewhere = server_elsewhere || hosts[r] != h;
      else workers_here += hosts[r] == h ? 1 : 0;
    }
    return workers_here > 1 && server_elsewhere;
  };
  for (int r = config.servers; r < world.size(); ++r) {
    bool first_on_host = true;
    for (int q = config.servers; q < r && grouped(hosts[r]); ++q) first_on_host = first_on_host && hosts[q] != hosts[r];
    if (first_on_host) job.leaders_.push_back(r);
  }
  job.group_ = world.split(server ? 0 : -1, world.rank());  // the servers
  job.local_ = world.split(server ? -1 : grouped(hosts[job.rank_]) ? hosts[job.rank_] : job.rank_, job.rank_);
  // The pair communicators of this rank's links: a server's to every leader, a leader's to
  // every server, each created in ascending order of the other end (no cycle of waits).
  const int me = job.rank_;
  if (server || std::find(job.leaders_.begin(), job.leaders_.end(), me) != job.leaders_.end()) {
    for (int other = 0; other < (server ? static_cast<int>(job.leaders_.size()) : config.servers); ++other) {
      const int s = server ? me : other, w = server ? job.leaders_[other] : me;
      comm::CommConfig cfg = world.config();
      cfg.job_ranks = {s, w};
      job.links_.push_back(comm::Communicator::create(store, server ? 0 : 1, 2, cfg, cat("ps/", s, "/", w)));
    }
  }
  return job;
}

PsJob PsJob::join_running(comm::Store& store, int world, const PsJobConfig& config, const comm::CommConfig& comm) {
  PsJob job;
  job.config_ = config;
  job.world_ = world;
  job.store_ = &store;
  const int64_t k = store.add(kPsJoins, 1, comm::Clock::now() + comm.timeout) - 1;
  job.rank_ = world + static_cast<int>(k);
  job.worker_ = static_cast<int>(k % job.workers());
  job.leaders_ = {job.rank_};
  for (int s = 0; s < config.servers; ++s) {
    comm::CommConfig cfg = comm;
    cfg.job_ranks = {s, job.rank_};
    job.links_.push_back(comm::Communicator::create(store, 1, 2, cfg, cat("ps/", s, "/j", k)));
  }
  job.own_store_ = std::make_unique<comm::HashStore>();
  job.local_ = comm::Communicator::create(*job.own_store_, 0, 1, {.timeout = comm.timeout}, "self");
  return job;
}

comm::Communicator& PsJob::servers_group() {
  LOOM_CHECK(server() && group_ != nullptr);
  return *group_;
}

comm::Communicator& PsJob::host_workers() {
  LOOM_CHECK(!server() && local_ != nullptr);
  return *local_;
}

std::vector<comm::Communicator*> PsJob::links() const {
  std::vector<comm::Communicator*> out;
  for (const auto& l : links_) out.push_back(l.get());
  return out;
}

PsJoinPoller::PsJoinPoller(PsJob& job, ParamServer& server) : job_(job), server_(server) {
  thread_ = std::thread([this] { poll(); });
}

PsJoinPoller::~PsJoinPoller() {
  serving_ = false;
  thread_.join();
}

void PsJoinPoller::poll() {
  comm::Communicator& group = job_.servers_group();
  const int s = group.rank();
  int64_t seen = 0;
  while (serving_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    int64_t count = 0;
    try {
      const auto v = job_.store().try_get(kPsJoins, comm::Clock::now() + std::chrono::seconds(1));
      count = v ? std::stoll(*v) : 0;
    } catch (const Error&) {
      continue;
    }
    for (; seen < count && serving_; ++seen) {
      comm::CommConfig cfg = group.config();
      const int rank = job_.world() + static_cast<int>(seen);
      cfg.job_ranks = {s, rank};
      try {
        auto link = comm::Communicator::create(job_.store(), 0, 2, cfg, cat("ps/", s, "/j", seen));
        const int l = server_.add_link(link.get());
        if (l < 0) continue;  // the run is over: the joiner's link closes
        log_info(cat("parameter server ", s, ": worker rank ", rank, " joined the job (link ", l, ")"));
        joined_.push_back(std::move(link));
      } catch (const Error& e) {
        log_warn(cat("parameter server ", s, ": worker rank ", rank, " asked to join but did not connect: ", e.what()));
      }
    }
  }
}

void gather_ps_ranges(comm::Communicator& servers, ParamSet& params, const std::vector<int64_t>& bounds) {
  float* v = params.values().data<float>();
  const int me = servers.rank();
  for (int s = 1; s < servers.size(); ++s) {
    const auto count = static_cast<size_t>(bounds[s + 1] - bounds[s]);
    if (me == s) comm::send(servers, {.buffer = v + bounds[s], .count = count, .peer = 0});
    if (me == 0) comm::recv(servers, {.buffer = v + bounds[s], .count = count, .peer = s});
  }
}

RankShare ps_server_share(const ParamSet& params, const ParamServer& server, int64_t begin, int64_t end) {
  RankShare share;
  const size_t es = dtype_size(params.dtype());
  const auto* v = static_cast<const char*>(params.values().raw());
  share.model = checkpoint::pieces(params, {{begin, end, v + begin * static_cast<int64_t>(es)}});
  const optim::RangeState st = server.optimizer_state();
  share.optimizer_steps = st.steps;
  for (const auto& [role, views] : st.buffers)
    for (checkpoint::Piece& p : checkpoint::pieces(params, {{begin, end, views[0].raw()}}, role + "."))
      share.optimizer.push_back(std::move(p));
  return share;
}

}  // namespace loom::parallel
