#include "job_start.h"

#include <cstdlib>
#include <numeric>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/parallel/ps_job.h"
#include "loom/parallel/mesh.h"

namespace loom::app {

namespace {

// An elastic launcher's word to this rank (launch::ElasticGeneration), from the LOOM_ELASTIC_*
// variables it set; nullopt outside an elastic job. InputError when malformed.
std::optional<launch::ElasticGeneration> elastic_generation_from_environment() {
  const char* g = std::getenv("LOOM_ELASTIC_GENERATION");
  if (g == nullptr) return std::nullopt;
  launch::ElasticGeneration e;
  auto number = [](const char* name, const char* v) {
    size_t used = 0;
    int64_t n = -1;
    try {
      n = std::stoll(v ? v : "", &used);
    } catch (...) {
      used = 0;
    }
    if (v == nullptr || used == 0 || v[used] != '\0' || n < 0)
      throw InputError(cat(name, " = \"", v ? printable(v) : "", "\": expected a count (set by loom launch)"));
    return n;
  };
  e.generation = number("LOOM_ELASTIC_GENERATION", g);
  e.since_unix_ms = number("LOOM_ELASTIC_SINCE_MS", std::getenv("LOOM_ELASTIC_SINCE_MS"));
  if (const char* r = std::getenv("LOOM_ELASTIC_REASON")) e.reason = r;
  return e;
}

// `loom train CFG --ps-join HOST:PORT`: one more worker for the running async or ssp job
// whose store is at HOST:PORT; the config is resolved for the job's world, read from the store.
void join_running_job(JobStart& job, const TrainArgs& a) {
  if (a.resume || a.restart || !a.init_from.empty())
    throw InputError("--ps-join with --resume, --restart or --init-from: a joining worker takes the job's parameters; "
                     "expected none of them");
  Config& c = job.c;
  const auto [host, port] = launch::parse_master(a.ps_join);
  if (port == 0) throw InputError(cat("--ps-join ", a.ps_join, ": expected the job's store as HOST:PORT with its port"));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(c.f("comm.timeout_s") * 1000));
  job.join_store = std::make_unique<comm::TcpStore>(
      comm::TcpStoreConfig{.host = host, .port = port, .secret = job.env.secret, .job_id = job.env.job_id},
      comm::Clock::now() + timeout);
  // The job's world and layout, which this worker's config must match.
  const std::string published = job.join_store->get(parallel::kPsLayout, comm::Clock::now() + timeout);
  const size_t nl = published.find('\n');
  const int world = std::stoi(published.substr(0, nl));
  c.resolve(world);
  job.tc = train_config(c, 1);
  const TrainConfig& t = job.tc;
  if (t.layout != published.substr(nl + 1))
    throw InputError(cat("--ps-join ", a.ps_join, ": this worker's layout \"", t.layout, "\" is not the job's \"",
                         published.substr(nl + 1), "\"; join with the job's config"));
  const parallel::PsMode mode = parallel::ps_mode_named(t.parallel.ps.mode);
  if (t.parallel.ps.servers == 0 || mode == parallel::PsMode::kSync)
    throw InputError(cat("--ps-join ", a.ps_join, ": the job trains ",
                         t.parallel.ps.servers == 0 ? std::string("without parameter servers")
                                                    : std::string("in sync mode, whose steps need a fixed set of workers"),
                         "; workers join async and ssp jobs"));
  job.ps_join_world = world;
}

}  // namespace

JobStart start_job(const TrainArgs& a) {
  JobStart job;
  comm::LaunchEnv& env = job.env;
  env = comm::launch_env_from_environment();
  // Under an elastic launcher, every generation after the first continues the run from its
  // latest checkpoint (or afresh when there is none yet), whatever the flags say.
  job.elastic = elastic_generation_from_environment();
  const std::optional<launch::ElasticGeneration>& elastic = job.elastic;
  job.restarted = elastic && elastic->generation > 0;
  if (elastic) train::install_resize_handler();  // at once: the launcher may ask while this rank is still starting
  Config& c = job.c;
  c.merge_file(a.config);
  c.apply_overrides(a.overrides);
  if (!a.ps_join.empty()) {
    join_running_job(job, a);
    return job;
  }
  // An elastic job's ranks come as they are: the run takes the most of them its layout can
  // use (the global batch divided among the replicas, tp x pp whole), and the rest wait.
  if (elastic) {
    const int usable = usable_world(c, env.size);
    if (usable < env.size && env.rank == 0)
      log_warn(cat("elastic: the config's layout uses ", usable, " of the ", env.size, " ranks available (",
                   "training.global_batch = ", c.i("training.global_batch"), ", micro_batch = ", c.i("training.micro_batch"),
                   ", tp x pp = ", c.i("parallel.tp") * c.i("parallel.pp"), "); ranks ", usable, " to ", env.size - 1,
                   " stay idle in this generation"));
    if (env.rank >= usable) {
      job.exit = 0;
      return job;
    }
    env.local_size = std::min(env.local_size, usable - (env.rank - env.local_rank));
    env.size = usable;
  }
  // A dry run outside a launcher plans the layout the config names (parallel.dp x tp x pp).
  const int ranks = a.dry_run && env.size == 1 ? layout_ranks(c, 1) : env.size;
  c.resolve(ranks);
  job.tc = train_config(c, env.local_size);
  // Sizes before allocation: the first rank of each host checks that what the host's ranks
  // will hold fits in the memory it has free, before any data or model is loaded.
  if (a.dry_run || env.local_rank == 0) {
    std::vector<int> here(static_cast<size_t>(a.dry_run && env.size == 1 ? ranks : env.local_size));
    std::iota(here.begin(), here.end(), a.dry_run && env.size == 1 ? 0 : env.rank - env.local_rank);
    const MemoryPlan mem = plan_memory(job.tc, ranks, here);
    if (a.dry_run) {
      std::printf("%s", describe(mem).c_str());
      std::fflush(stdout);
      check_fits(mem);
      std::printf("dry run: the config is valid for %d rank(s) and fits this host; nothing was loaded or written\n", ranks);
      job.exit = 0;
      return job;
    }
    check_fits(mem);
    const std::string lines = describe(mem);
    job.memory_plan_line = lines.substr(0, lines.find('\n'));
  }
  return job;
}

// `loom train`: the config resolved for this rank's job, then the trainer's run.
int run_train(const TrainArgs& a) {
  JobStart job = start_job(a);
  if (job.exit) return *job.exit;
  set_log_quiet(a.quiet || job.env.rank != 0);
  return train::run(a, job);  // job.threads as resolved for this host's ranks
}

}  // namespace loom::app
