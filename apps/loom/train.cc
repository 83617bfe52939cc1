// `loom train`: one rank of a job trains a model on real data, writing the run directory
// (DESIGN.md section 4): config.toml, metrics.jsonl, checkpoints/step_N, logs/. The step
// itself is parallel::Parallelized's (loom/parallelize.h); this file resolves the config,
// builds the model, joins the job and keeps the run's books: metrics, evaluation,
// checkpoints, signals, traces (docs/architecture.md walks a step).
#include <algorithm>
#include <array>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <thread>

#include "commands.h"
#include "config.h"
#include "launch.h"
#include "loom/checkpoint.h"
#include "loom/checkpointing.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "loom/log.h"
#include "loom/metrics.h"
#include "loom/parallelize.h"
#include "loom/rendezvous.h"
#include "loom/step_tracer.h"
#include "loom/straggler.h"
#include "loom/trace.h"
#include "memory_plan.h"
#include "outputs.h"
#include "ps_train.h"
#include "run_dir.h"
#include "stages.h"
#include "train_watch.h"
#include "workload.h"

namespace loom::app {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// SIGTERM (what Kubernetes and Slurm send before killing): the run finishes its step,
// saves and exits 0 (docs/launch.md, "Preemption").
volatile std::sig_atomic_t g_terminate = 0;
void on_terminate(int) { g_terminate = 1; }

// SIGUSR1 from an elastic launcher: ranks wait to join, so the run stops after its next
// checkpoint with kExitForResize and the launcher restarts it on more ranks.
volatile std::sig_atomic_t g_resize = 0;
void on_resize(int) { g_resize = 1; }


// The largest world size up to `available` that `c` resolves for; `available` itself when
// none does (resolving then names what is wrong).
int usable_world(const Config& c, int available) {
  for (int w = available; w >= 1; --w) {
    Config trial = c;
    try {
      trial.resolve(w);
      return w;
    } catch (const InputError&) {
    }
  }
  return available;
}

}  // namespace

// The job as this rank starts it: the launch environment (an elastic generation's usable
// ranks), the config resolved for them, and the memory plan checked on each host's first
// rank before anything is loaded.
struct JobStart {
  comm::LaunchEnv env;
  Config c;
  std::optional<ElasticGeneration> elastic;  // under an elastic launcher: this generation
  bool restarted = false;                    // a later generation of an elastic job
  std::string memory_plan_line;  // logged once the input has been found good
  std::optional<int> exit;       // set: nothing more to do (a dry run, an idle elastic rank, a ps join)
};

JobStart start_job(const TrainArgs& a) {
  JobStart job;
  comm::LaunchEnv& env = job.env;
  env = comm::launch_env_from_environment();
  // Under an elastic launcher, every generation after the first continues the run from its
  // latest checkpoint (or afresh when there is none yet), whatever the flags say.
  job.elastic = elastic_generation_from_environment();
  const std::optional<ElasticGeneration>& elastic = job.elastic;
  job.restarted = elastic && elastic->generation > 0;
  if (elastic) {  // at once: the launcher may ask while this rank is still starting
    struct sigaction grow{};
    grow.sa_handler = on_resize;
    grow.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &grow, nullptr);
  }
  Config& c = job.c;
  c.merge_file(a.config);
  c.apply_overrides(a.overrides);
  if (!a.ps_join.empty()) {
    job.exit = run_ps_join(c, a);
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
  // Sizes before allocation: the first rank of each host checks that what the host's ranks
  // will hold fits in the memory it has free, before any data or model is loaded.
  if (a.dry_run || env.local_rank == 0) {
    std::vector<int> here(static_cast<size_t>(a.dry_run && env.size == 1 ? ranks : env.local_size));
    std::iota(here.begin(), here.end(), a.dry_run && env.size == 1 ? 0 : env.rank - env.local_rank);
    const MemoryPlan mem = plan_memory(c, ranks, here);
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

namespace {

double mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// One rank's run of `loom train` after its config is resolved: the model built, the run
// directory claimed, the weights loaded, the job joined and the model laid out, then the
// steps with their metrics, evaluations and checkpoints. The methods run in that order.
class TrainRun {
 public:
  TrainRun(const TrainArgs& a, JobStart& job);
  void build_model();
  void claim_run_dir();
  void load_weights();
  void parallelize();
  void open_outputs();
  int64_t start_step() const { return start_step_; }
  int64_t end_step() const { return end_step_; }
  void step(int64_t step);
  int finish();

 private:
  void check_finite();
  void train_step(int64_t step);
  void after_step(int64_t done, double loss, double step_s, double busy_ms, obs::JsonLine& line, bool tracing);
  void log_start();
  void log_stage_state(const parallel::StateBytes& mem);
  std::array<bool, 3> agree(int64_t done, double busy_ms);
  double save(int64_t step, bool loss_finite);
  void saved(const std::optional<std::string>& dir);
  void print_summary() const;

  const TrainArgs& a_;
  comm::LaunchEnv& env_;
  const Config& c_;
  JobStart& job_;
  const bool lead_;  // writes the run directory, metrics and checkpoints
  const std::string run_, ckpt_root_;
  const bool resume_;
  const int64_t steps_, global_batch_, micro_batch_, per_rank_, accum_;
  const uint64_t seed_;
  const parallel::StepConfig config_;
  const optim::ScheduleConfig sched_;

  Mesh mesh_;
  Workload w_;
  std::optional<RunDirectory> run_dir_;
  std::optional<checkpoint::Checkpoint> ck_;
  std::optional<std::pair<double, int64_t>> saved_scale_;  // fp16's loss scale and clean steps, resumed
  std::string nonfinite_seen_;  // the last report of NaN or Inf in what this rank read
  double load_s_ = 0;
  int64_t start_step_ = 0, end_step_ = 0;
  std::unique_ptr<comm::TcpStoreServer> server_;
  std::unique_ptr<comm::Store> store_;
  std::unique_ptr<comm::Communicator> world_;
  std::unique_ptr<parallel::Parallelized> pm_;
  std::vector<uint8_t> zeros_kept_;  // [training] keep_zeros
  std::vector<int64_t> trace_steps_;
  std::optional<obs::Trace> trace_;
  std::optional<parallel::StepTracer> tracer_;
  std::optional<obs::MetricsFile> metrics_;
  std::optional<data::Sampler> sampler_;
  std::optional<obs::Progress> progress_;
  std::optional<parallel::CheckpointSaver> saver_;
  std::optional<obs::StragglerWatch> stragglers_;
  nlohmann::json layout_;
  std::string last_checkpoint_;
  parallel::EvalResult last_eval_;
  double tokens_per_step_ = 0;
  double ema_step_s_ = 0, comm_ms_total_ = 0, exposed_ms_total_ = 0, step_s_total_ = 0, bubble_total_ = 0,
         predicted_total_ = 0, replayed_total_ = 0;
  double ckpt_stall_ms_ = -1;  // of the save after the last step, for the next step's line
  int64_t delay_ms_ = 0;
  int exit_code_ = 0;
  std::chrono::steady_clock::time_point last_save_;
  std::optional<std::chrono::steady_clock::time_point> terminate_seen_;
};

TrainRun::TrainRun(const TrainArgs& a, JobStart& job)
    : a_(a),
      env_(job.env),
      c_(job.c),
      job_(job),
      lead_(job.env.rank == 0),
      run_(job.c.run_path()),
      ckpt_root_(job.c.s("checkpoint.dir").empty() ? (fs::path(run_) / "checkpoints").string() : job.c.s("checkpoint.dir")),
      resume_(a.resume || (job.restarted && checkpoint::latest_step_dir(ckpt_root_))),
      steps_(job.c.i("training.steps")),
      global_batch_(job.c.i("training.global_batch")),
      micro_batch_(job.c.i("training.micro_batch")),
      per_rank_(global_batch_ / job.c.i("parallel.dp")),
      accum_(per_rank_ / micro_batch_),
      seed_(static_cast<uint64_t>(job.c.i("job.seed"))),
      config_(step_config(job.c)),
      sched_(schedule_config(job.c)),
      end_step_(steps_) {
  if (a.resume && a.restart) throw InputError("--resume and --restart: expected one of them");
  if (a.resume && !a.init_from.empty())
    throw InputError("--resume and --init-from: expected one of them (--resume continues the run's own checkpoints)");
  // Everything that can be wrong with the input is found before anything is written.
  if (!a.init_from.empty()) check_apart("--init-from", a.init_from, "checkpoint.dir", ckpt_root_);
  if (c_.b("training.keep_zeros") && a.init_from.empty() && !resume_)
    throw InputError("training.keep_zeros = true keeps the zeros of the weights training starts from; expected "
                     "--init-from PATH (a pruned checkpoint, loom prune) or --resume");
}

// This rank's part of the model (a pipeline stage) and piece (tensor parallelism: its seam
// is the mesh's, attached once the job has joined). A resume loads every weight: the
// random initialization would be overwritten.
void TrainRun::build_model() {
  mesh_ = mesh_coordinates(c_, env_.rank);
  w_ = make_workload(c_, mesh_part(c_, mesh_), mesh_.shard(c_.b("parallel.sequence_parallel")), /*init=*/!resume_);
}

// Rank 0 writes the run directory and claims it once the config, data and model are known
// good and before any checkpoint is read: a second job, or a --resume of a running one, is
// refused here naming the holder.
void TrainRun::claim_run_dir() {
  if (!lead_) return;
  const bool own_ckpt_dir = !c_.s("checkpoint.dir").empty();
  if (a_.restart && !job_.restarted && own_ckpt_dir && checkpoint::latest_step_dir(ckpt_root_))
    throw InputError(cat(ckpt_root_, ": checkpoint.dir holds the old run's checkpoints, which --restart would mix with "
                         "the new run's; move it or set another checkpoint.dir"));
  run_dir_.emplace(RunDirectory::claim(run_, resume_ || job_.restarted ? RunDirectory::Mode::kResume
                                             : a_.restart ? RunDirectory::Mode::kRestart
                                                          : RunDirectory::Mode::kFresh,
                                       own_ckpt_dir ? ckpt_root_ : ""));
  if (!run_dir_->moved_aside().empty()) log_info(cat("--restart: the old ", run_, " is now ", run_dir_->moved_aside()));
}

// NaN or Inf in the weights or the optimizer state this rank read would only spread through
// training. Checked after each load; a report is given once.
void TrainRun::check_finite() {
  const std::string bad = ck_->nonfinite_report();
  if (bad.empty() || bad == nonfinite_seen_) return;
  nonfinite_seen_ = bad;
  if (!a_.allow_nonfinite)
    throw InputError(cat(bad, "; training from it would spread them: resume from an earlier checkpoint, or pass "
                              "--allow-nonfinite"));
  log_warn(cat(bad, "; resuming anyway (--allow-nonfinite)"));
}

void TrainRun::load_weights() {
  ParamSet& params = w_.model->params();
  if (resume_) {
    ck_.emplace(parallel::open_for_resume(ckpt_root_, w_.model_json(), seed_, steps_, global_batch_));
    const checkpoint::State& saved = ck_->state();
    const auto t0 = std::chrono::steady_clock::now();
    ck_->load_params(params);
    load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_finite();
    // Only once `latest` has proven good: a refused resume changes nothing.
    if (lead_) parallel::set_aside_uncommitted_steps(ckpt_root_);
    start_step_ = saved.step;
    if (config_.fp16 && saved.raw.contains("loss_scale")) {  // absent when the run trained in another precision
      const json& ls = saved.raw["loss_scale"];
      const std::string at = cat(ck_->path(), "/state.json: loss_scale");
      if (!ls.is_object() || !ls.contains("scale") || !ls["scale"].is_number() || !ls.contains("clean_steps") ||
          !ls["clean_steps"].is_number_integer())
        throw InputError(cat(at, ": expected {\"scale\": a power of two, \"clean_steps\": an integer}"));
      saved_scale_.emplace(ls["scale"].get<double>(), ls["clean_steps"].get<int64_t>());
      try {
        optim::LossScaler(config_.loss_scale).restore(saved_scale_->first, saved_scale_->second);  // checked now
      } catch (const InputError& e) {
        throw InputError(cat(at, ": ", e.what()));
      }
    }
  }
  if (!a_.init_from.empty() && !resume_) {
    // Weights only, this rank's piece of each, from whatever layout (or file) holds them.
    ck_ = checkpoint::Checkpoint::open(a_.init_from);
    ck_->load_params(params);
    check_finite();
    log_info(cat("initialized from ", ck_->path()));
  }
}

// Joins the job, splits the mesh and lays the model out on it; then the optimizer state a
// resume reads, and every replica's weights made equal.
void TrainRun::parallelize() {
  world_ = comm::join_world(
      env_, {.transport = c_.s("comm.transport"),
             .timeout = std::chrono::milliseconds(static_cast<int64_t>(c_.f("comm.timeout_s") * 1000))},
      server_, store_);
  check_same_layout(*world_, c_);
  if (mesh_.split()) split_mesh(*world_, mesh_);
  pm_ = parallel::parallelize(*w_.model, mesh_, *world_, config_);
  if (w_.teacher) {
    const nn::Shard vocab = mesh_.shard(false);
    pm_->set_loss_targets([this, vocab](const Tensor& tokens, nn::CrossEntropyCtx& loss) {
      loss.distill = w_.teacher->targets(tokens, vocab, loss.distill.soft);
    });
  }
  if (saved_scale_) pm_->loss_scaler().restore(saved_scale_->first, saved_scale_->second);
  trace_steps_ = obs::parse_steps(c_.s("profile.trace_steps"));  // [profile] trace_steps
  if (ck_ && resume_) {
    const auto t0 = std::chrono::steady_clock::now();
    pm_->load_optimizer(*ck_);
    check_finite();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() + load_s_;
    log_info(cat("resuming from ", ck_->path(), " at step ", start_step_, ": this rank read ",
                 static_cast<double>(ck_->bytes_read()) / (1 << 20), " MiB of shards in ", s * 1e3, " ms (",
                 static_cast<double>(ck_->bytes_read()) / s / 1e9, " GB/s)"));
  }
  // The files read stay in memory as long as the checkpoint is open: not during training.
  last_checkpoint_ = ck_ && resume_ ? ck_->path() : "";
  ck_.reset();
  pm_->sync_params();
  if (c_.b("training.keep_zeros")) zeros_kept_ = zero_mask(w_.model->params());
  if (!trace_steps_.empty()) {
    comm::barrier(*world_);  // every rank's origin: the barrier's exit
    trace_.emplace(obs::Trace::Clock::now());
    tracer_.emplace(*trace_);
  }
}

// Rank 0's metrics file and config.toml; every rank's sampler, progress, saver and signals.
void TrainRun::open_outputs() {
  const std::string metrics_path = (fs::path(run_) / "metrics.jsonl").string();
  if (lead_) {
    fs::create_directories(fs::path(run_) / "logs");
    write_file_atomic((fs::path(run_) / "config.toml").string(), c_.to_toml());
    const int64_t reached = resume_ || job_.restarted ? truncate_metrics(metrics_path, start_step_) : 0;
    metrics_.emplace(metrics_path);
    if (job_.restarted)
      log_info(cat("elastic generation ", job_.elastic->generation, " (", job_.elastic->reason, "): ",
                   resume_ ? cat("resumed from step ", start_step_) : std::string("no checkpoint yet, started afresh"),
                   " on ", world_->size(), " rank(s); ", std::max<int64_t>(reached - start_step_, 0),
                   " step(s) lost (the metrics had reached step ", reached, ")"));
  }
  sampler_.emplace(w_.train->size(), seed_);
  progress_.emplace(steps_, c_.i("job.log_every"), a_.quiet || !lead_);
  tokens_per_step_ = static_cast<double>(global_batch_ * w_.train->tokens_per_example());
  log_start();
  layout_ = {{"world", world_->size()}, {"dp", mesh_.dp_size}, {"tp", mesh_.tp}, {"pp", mesh_.pp},
             {"virtual_stages", mesh_.v}, {"zero", c_.i("parallel.zero")},
             {"sequence_parallel", c_.b("parallel.sequence_parallel")}};
  install_fault_hook(c_.s("debug.fault_at"), env_.rank);
  saver_.emplace(*world_, c_.b("checkpoint.async"));
  if (c_.b("checkpoint.async")) saver_->prepare(pm_->share_bytes());
  last_save_ = std::chrono::steady_clock::now();
  struct sigaction term{};
  term.sa_handler = on_terminate;
  term.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &term, nullptr);
  delay_ms_ = step_delay_ms(c_.s("debug.delay_ms"), env_.rank);
  stragglers_.emplace(world_->size());
}

void TrainRun::log_start() {
  const parallel::StateBytes mem0 = pm_->state_bytes();
  const bool piped = mesh_.pp > 1;
  log_info(cat("training ", c_.s("model.preset"), " (", w_.model->params().numel(), " parameters) on ", c_.s("data.train"),
               ": ", steps_, " steps of ", global_batch_, " x ", w_.train->tokens_per_example(), " tokens, ",
               mesh_.dp_size, " data-parallel rank(s)",
               mesh_.tp > 1 ? cat(" x ", mesh_.tp, " tensor-parallel ranks") : std::string(),
               piped ? cat(" x ", mesh_.pp, " pipeline stages (", c_.s("parallel.pp_schedule"), ", ", accum_,
                           " micro-batches", mesh_.v > 1 ? cat(", ", mesh_.v, " chunks per stage") : std::string(), ")")
                     : std::string(),
               " x ", c_.threads(env_.local_size), " thread(s), ZeRO ", c_.i("parallel.zero"),
               c_.b("parallel.deterministic") ? ", deterministic" : "", "; run directory ", run_));
  if (!job_.memory_plan_line.empty()) log_info("planned " + job_.memory_plan_line);
  log_info(cat("model state per rank: parameters ", mb(mem0.params), " MiB, gradients ", mb(mem0.grads),
               " MiB, optimizer ", mb(mem0.optimizer), " MiB"));
}

// Stages hold different parts: after the first step (every buffer touched) rank 0 logs
// every rank's. Collective.
void TrainRun::log_stage_state(const parallel::StateBytes& mem) {
  int64_t mine[4] = {w_.model->params().numel(), mem.params, mem.grads, mem.optimizer};
  std::vector<int64_t> all(4 * static_cast<size_t>(world_->size()));
  comm::all_gather(*world_, {.input = mine, .output = all.data(), .count = 4, .dtype = DType::kI64});
  for (int r = 0; r < world_->size(); ++r) {
    const int64_t* x = all.data() + 4 * r;
    log_info(cat("model state of rank ", r, " (", mesh_coordinates(c_, r).where(), "): ", x[0],
                 " parameters; parameters ", mb(x[1]), " MiB, gradients ", mb(x[2]), " MiB, optimizer ", mb(x[3]), " MiB"));
  }
}

// Collective: the time this rank's training stopped for the save (with async, the copy of
// its share; otherwise the whole write).
double TrainRun::save(int64_t step, bool loss_finite) {
  const auto t0 = std::chrono::steady_clock::now();
  pm_->materialize_params();  // collective: every rank takes part
  json rng = {{"generator", "xoshiro256** (splitmix64-seeded)"}, {"seed", seed_},
              {"streams", {{"init", 1}, {"data_epoch_e", "1000 + e"}}},
              {"data_epoch", step * global_batch_ / w_.train->size()}};
  json state = {{"data_cursor", step * global_batch_}, {"rng", rng}, {"model", w_.model_json()}, {"config", c_.to_toml()}};
  if (config_.fp16)
    state["loss_scale"] = {{"scale", pm_->loss_scaler().scale()}, {"clean_steps", pm_->loss_scaler().clean_steps()}};
  const std::string dir =
      saver_->save([&](checkpoint::PieceArena& arena) { return pm_->share(arena); },
                   {.root = ckpt_root_, .step = step, .state = state, .layout = layout_,
                    .options = {.keep = static_cast<int>(c_.i("checkpoint.keep")), .loss_finite = loss_finite}});
  last_save_ = std::chrono::steady_clock::now();
  if (!loss_finite)  // prune keeps the newest finite checkpoint whatever checkpoint.keep says
    log_warn(cat("step ", step, ": the loss is not finite; saving it, and the newest finite checkpoint is kept "
                 "whatever checkpoint.keep says"));
  if (!dir.empty()) {
    last_checkpoint_ = dir;
    progress_->note(cat("checkpoint ", dir));
  }
  return std::chrono::duration<double, std::milli>(last_save_ - t0).count();
}

void TrainRun::saved(const std::optional<std::string>& dir) {  // an async save that completed
  if (!dir) return;
  last_checkpoint_ = *dir;
  progress_->note(cat("checkpoint ", *dir));
}

// Whether to save now: every checkpoint.every steps, at the end, when checkpoint.every_s
// have passed on rank 0's clock, or when any rank got SIGTERM. The last two need every rank
// to agree, and rank 0 watches every rank's compute time for stragglers: one small
// all-gather a step (`done` steps done). Returns whether any rank got SIGTERM, has
// checkpoint.every_s due, or was asked to resize.
std::array<bool, 3> TrainRun::agree(int64_t done, double busy_ms) {
  const std::array<double, 4> mine = {
      g_terminate ? 1.0 : 0.0,
      lead_ && c_.f("checkpoint.every_s") > 0 &&
              std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
                  c_.f("checkpoint.every_s")
          ? 1.0
          : 0.0,
      busy_ms, g_resize ? 1.0 : 0.0};
  if (g_terminate && !terminate_seen_) terminate_seen_ = std::chrono::steady_clock::now();
  std::vector<double> every_rank(4 * static_cast<size_t>(world_->size()));
  comm::all_gather(*world_, {.input = mine.data(), .output = every_rank.data(), .count = 4, .dtype = DType::kF64});
  std::array<bool, 3> flags = {false, false, false};  // SIGTERM, every_s due, resize asked
  std::vector<double> busy;
  for (int r = 0; r < world_->size(); ++r) {
    flags[0] = flags[0] || every_rank[4 * r] != 0;
    flags[1] = flags[1] || every_rank[4 * r + 1] != 0;
    flags[2] = flags[2] || every_rank[4 * r + 3] != 0;
    busy.push_back(every_rank[4 * r + 2]);
  }
  double median = 0;
  if (lead_ && world_->size() > 1)
    for (int r : stragglers_->update(busy, &median))
      log_warn(cat("step ", done, ": rank ", r, " (", mesh_coordinates(c_, r).where(), ") is a straggler: ", busy[r],
                   " ms of compute against the median ", median, " ms, over 3x for 3 steps in a row (not stopped)"));
  return flags;
}

// One optimizer step and what follows it: the metrics line, an evaluation, a checkpoint.
// A RuntimeError (a dead peer, a stall, a loss that is not finite) names the step and the
// rank's place, and points to this rank's flight recorder.
void TrainRun::step(int64_t step) {
  try {
    train_step(step);
  } catch (const RuntimeError& e) {
    const std::string flight = dump_flight_record(
        run_, env_.rank, step + 1, e.what(),
        {{"world", world_.get()}, {"dp", mesh_.dp.get()}, {"pipe", mesh_.pipe.get()}, {"tied", mesh_.tied.get()},
         {"tp", mesh_.tpc.get()}, {"mp", mesh_.mp.get()}});
    throw RuntimeError(cat("rank ", env_.rank, mesh_.split() ? cat(" (", mesh_.where(), ")") : "", " at step ", step + 1,
                           ": ", e.what(), flight.empty() ? std::string() : cat(" (flight recorder: ", flight, ")")));
  }
}

void TrainRun::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t done = step + 1;
  if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
  const bool tracing = trace_ && std::binary_search(trace_steps_.begin(), trace_steps_.end(), done);
  if (tracing) {
    tracer_->push(cat("step ", done));
    pm_->set_tracer(&*tracer_);
  }
  // This replica's shard of the global batch: items [replica * per_rank, (replica + 1) * per_rank).
  const int replica = pm_->replica();
  const double lr = optim::lr_at(sched_, step);
  const parallel::StepResult r = pm_->step(done, [&](int64_t m) {
    std::vector<int64_t> items(static_cast<size_t>(micro_batch_));
    for (int64_t i = 0; i < micro_batch_; ++i)
      items[i] = sampler_->item(step * global_batch_ + replica * per_rank_ + m * micro_batch_ + i);
    return w_.train->batch(items);
  }, lr);
  // A loss or gradient norm that is not finite stops the run at this step, before any
  // update or checkpoint.
  if (!r.nonfinite.empty())
    throw RuntimeError(cat(r.nonfinite, ". The run stops before updating; ",
                           last_checkpoint_.empty() ? std::string("no checkpoint was written")
                                                    : cat("the last checkpoint, ", last_checkpoint_, ", is intact"),
                           " (a lower training.lr or a training.grad_clip may help)"));
  if (!zeros_kept_.empty()) apply_zero_mask(w_.model->params(), zeros_kept_);
  // [job] mem_limit_mb: the rank's peak resident memory, checked after every step.
  if (const double limit = c_.f("job.mem_limit_mb"); limit > 0 && peak_rss_mb() > limit)
    throw RuntimeError(cat("used ", static_cast<int64_t>(peak_rss_mb()), " MiB at its peak, over job.mem_limit_mb = ",
                           limit, " MiB per rank"));
  const parallel::StateBytes mem = pm_->state_bytes();  // resident pages, after the step
  if (mesh_.split() && step == start_step_) log_stage_state(mem);
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ema_step_s_ = step == start_step_ ? step_s : 0.9 * ema_step_s_ + 0.1 * step_s;
  if (step > start_step_) {  // the first step warms caches and connections
    comm_ms_total_ += r.comm.comm_ms;
    exposed_ms_total_ += r.comm.exposed_ms;
    step_s_total_ += step_s;
    bubble_total_ += r.bubble.measured;
    predicted_total_ += r.bubble.predicted;
    replayed_total_ += r.bubble.replayed;
  }
  obs::JsonLine line;
  line.add("step", done).add("loss", r.loss).add("lr", lr)
      .add("grad_norm", r.grad_norm).add("tokens", static_cast<int64_t>(tokens_per_step_)).add("step_ms", step_s * 1e3)
      .add("tokens_per_s", tokens_per_step_ / step_s).add("mem_peak_mb", peak_rss_mb())
      .add("comm_ms", r.comm.comm_ms).add("exposed_comm_ms", r.comm.exposed_ms).add("comm_bytes", r.comm.bytes)
      .add("mem_params_mb", mb(mem.params)).add("mem_grads_mb", mb(mem.grads))
      .add("mem_optimizer_mb", mb(mem.optimizer));
  if (config_.fp16) line.add("loss_scale", r.loss_scale).add("skipped", static_cast<int64_t>(r.skipped));
  // This rank's compute: its step less its waits for the others.
  double busy_ms = step_s * 1e3 - r.comm.exposed_ms;
  if (r.pipe) {
    line.add("pp_bubble", r.bubble.measured)
        .add("pp_bubble_predicted", r.bubble.predicted)
        .add("pp_bubble_replayed", r.bubble.replayed);
    line.add("pp_wait_ms", r.pipe->wait_ms).add("pp_comm_ms", r.pipe->send_ms).add("pp_comm_bytes", r.pipe->sent_bytes);
    busy_ms -= r.pipe->wait_ms;
  }
  if (r.tp) {
    line.add("tp_comm_ms", r.tp->ms).add("tp_exposed_comm_ms", r.tp->exposed_ms).add("tp_comm_bytes", r.tp->bytes);
    line.add("tp_comm_calls", r.tp->calls);
    busy_ms -= r.tp->exposed_ms;
  }
  after_step(done, r.loss, step_s, busy_ms, line, tracing);
}

// Evaluation, the ranks' agreement on saving and stopping, the metrics line, the checkpoint
// and the end of a traced step.
void TrainRun::after_step(int64_t done, double loss, double step_s, double busy_ms, obs::JsonLine& line, bool tracing) {
  const int64_t eval_every = c_.i("training.eval_every");
  if (w_.val && ((eval_every > 0 && done % eval_every == 0) || done == steps_)) {
    if (tracing) tracer_->push("evaluate");
    const parallel::EvalResult e = pm_->evaluate(*w_.val, c_.i("training.eval_steps") * micro_batch_, w_.eval_batch);
    if (tracing) tracer_->pop();
    if (lead_) {
      last_eval_ = e;
      line.add("val_loss", e.loss);
      if (e.accuracy >= 0) line.add("val_accuracy", e.accuracy);
      progress_->note(cat("step ", done, ": val_loss ", e.loss, e.accuracy >= 0 ? cat(", val_accuracy ", e.accuracy) : std::string()));
    }
  }
  saved(saver_->poll());
  const std::array<bool, 3> flags = agree(done, busy_ms);
  const int64_t every = c_.i("checkpoint.every");
  const bool stop = flags[0] && done < steps_;
  // The step's line goes out before its checkpoint: a checkpoint never outlives the metrics
  // of the steps it holds (a crash in between loses neither). The save's stall is therefore
  // reported on the next step's line.
  if (ckpt_stall_ms_ >= 0) line.add("ckpt_stall_ms", ckpt_stall_ms_);
  ckpt_stall_ms_ = -1;
  if (job_.restarted && done == start_step_ + 1) {
    const double since_s = static_cast<double>(unix_ms() - job_.elastic->since_unix_ms) / 1e3;
    line.add("elastic_restart_s", since_s);
    log_info(cat("elastic generation ", job_.elastic->generation, ": first step done ", since_s,
                 " s after the previous generation ended"));
  }
  if (metrics_) metrics_->write(line);
  progress_->update(done, loss, tokens_per_step_ / step_s, ema_step_s_);
  const bool saving = (every > 0 && done % every == 0) || done == steps_ || flags[1] || stop;
  if (saving) {
    if (tracing) tracer_->push("checkpoint");
    ckpt_stall_ms_ = save(done, std::isfinite(loss));
    if (tracing) tracer_->pop();
  }
  if (saving && flags[2] && !stop && done < steps_) {
    saved(saver_->wait());
    log_info(cat("saved step ", done, " of ", steps_, " (", last_checkpoint_,
                 "); stopping so that the elastic launcher restarts the job with the ranks waiting to join"));
    end_step_ = done;
    exit_code_ = kExitForResize;
  }
  if (stop) {
    saved(saver_->wait());
    if (!terminate_seen_) terminate_seen_ = std::chrono::steady_clock::now();  // another rank's signal
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - *terminate_seen_).count();
    log_info(cat("SIGTERM: saved step ", done, " of ", steps_, " (", last_checkpoint_, ") ", took,
                 " s after the signal; stopping. `loom train ... --resume` continues from it"));
    if (took > c_.f("checkpoint.grace_s"))
      log_warn(cat("the save after SIGTERM took ", took, " s, over checkpoint.grace_s = ", c_.f("checkpoint.grace_s"),
                   " s: the job may be killed before it ends next time"));
    end_step_ = done;
  }
  if (tracing) {
    tracer_->pop();  // the step
    pm_->set_tracer(nullptr);
    if (done == trace_steps_.back() || end_step_ == done) {
      const std::string path = (fs::path(run_) / "trace.json").string();
      parallel::write_merged_trace(*world_, *trace_, path);
      progress_->note(cat("trace of step(s) ", c_.s("profile.trace_steps"), " of ", world_->size(), " rank(s): ", path));
    }
  }
}

int TrainRun::finish() {
  saved(saver_->wait());  // the last save complete before the run reports done
  progress_->finish();
  pm_->materialize_params();
  if (lead_ && end_step_ == steps_ && w_.val && last_eval_.items > 0 && last_eval_.accuracy >= 0) {
    // A full pass over the test set for the final figure (a classifier: never split).
    const parallel::EvalResult full = parallel::evaluate(*w_.model, *w_.val, 0, w_.eval_batch);
    std::printf("test accuracy %.4f over %lld images (loss %.4f)\n", full.accuracy, static_cast<long long>(full.items),
                full.loss);
  }
  if (lead_) print_summary();
  if (lead_) std::printf("run directory: %s\n", printable(run_).c_str());
  return exit_code_;
}

void TrainRun::print_summary() const {
  const int64_t timed = end_step_ - start_step_ - 1;
  if (timed <= 0) return;
  const auto n = static_cast<double>(timed);
  const long long dp_size = mesh_.dp_size;
  if (mesh_.pp > 1) {
    // The data-parallel scaling figure below assumes every rank computes the whole step,
    // which stages do not: the pipeline's own summary instead.
    std::printf("pipeline: dp %lld x pp %d%s = %d ranks (%s, %lld micro-batches), %.0f tokens/s, step %.1f ms, bubble %.1f%% "
                "(the simulator predicts %.1f%% from the measured mean costs, %.1f%% replaying each action)%s\n",
                dp_size, mesh_.pp, mesh_.tp > 1 ? cat(" x tp ", mesh_.tp).c_str() : "", world_->size(),
                c_.s("parallel.pp_schedule").c_str(), static_cast<long long>(accum_), tokens_per_step_ * n / step_s_total_,
                step_s_total_ * 1e3 / n, 100.0 * bubble_total_ / n, 100.0 * predicted_total_ / n,
                100.0 * replayed_total_ / n,
                dp_size > 1 ? cat(", gradient communication over replicas ", comm_ms_total_ / n, " ms/step of which ",
                                  exposed_ms_total_ / n, " ms exposed").c_str()
                            : "");
  } else if (dp_size > 1) {
    const double step_ms = step_s_total_ * 1e3 / n;
    std::printf("data parallel: %lld ranks, %.0f tokens/s (%.0f per rank), step %.1f ms, gradient communication "
                "%.1f ms/step of which %.1f ms exposed (%.1f%% of the step)\n",
                dp_size, tokens_per_step_ * n / step_s_total_, tokens_per_step_ * n / step_s_total_ / static_cast<double>(dp_size),
                step_ms, comm_ms_total_ / n, exposed_ms_total_ / n, 100.0 * exposed_ms_total_ / (step_s_total_ * 1e3));
    const double efficiency = 1.0 - exposed_ms_total_ / (step_s_total_ * 1e3);
    std::printf("scaling: %.2fx one rank's tokens/s at the same per-rank compute speed (efficiency %.1f%%, the share "
                "of the step not spent waiting on gradients)\n",
                static_cast<double>(dp_size) * efficiency, 100.0 * efficiency);
  }
}

}  // namespace

// Resolve the config, build the model, join the job and lay the model out on its mesh, then
// loop { step, log, evaluate, checkpoint } (TrainRun::step).
int run_train(const TrainArgs& a) {
  JobStart job = start_job(a);
  if (job.exit) return *job.exit;
  set_log_quiet(a.quiet || job.env.rank != 0);
  apply_compute_settings(job.c, job.env.local_size);
  if (job.c.i("parallel.ps_servers") > 0) return run_ps_train(job.c, a, job.env, job.restarted);
  TrainRun run(a, job);
  run.build_model();
  run.claim_run_dir();
  run.load_weights();
  run.parallelize();
  run.open_outputs();
  const int64_t steps = job.c.i("training.steps");
  for (int64_t step = run.start_step(); step < steps && run.end_step() == steps; ++step) run.step(step);
  return run.finish();
}

}  // namespace loom::app
