// `loom train`: one process trains a model on real data, writing the run directory
// (DESIGN.md section 4): config.toml, metrics.jsonl, checkpoints/step_N, logs/.
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

#include "loom/checkpointing.h"
#include "commands.h"
#include "config.h"
#include "loom/bounded_json.h"
#include "loom/checkpoint.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/data_parallel.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "loom/log.h"
#include "loom/loss_scale.h"
#include "loom/metrics.h"
#include "loom/optim.h"
#include "loom/pipeline.h"
#include "loom/rendezvous.h"
#include "loom/straggler.h"
#include "loom/tensor_parallel.h"
#include "loom/threads.h"
#include "loom/trace.h"
#include "launch.h"
#include "memory_plan.h"
#include "outputs.h"
#include "ps_train.h"
#include "run_dir.h"
#include "stages.h"
#include "step_tracer.h"
#include "task.h"
#include "train_watch.h"

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

int run_train(const TrainArgs& a) {
  JobStart job = start_job(a);
  if (job.exit) return *job.exit;
  comm::LaunchEnv& env = job.env;
  const Config& c = job.c;
  const bool restarted = job.restarted;
  const std::optional<ElasticGeneration>& elastic = job.elastic;
  const std::string& memory_plan_line = job.memory_plan_line;
  set_log_quiet(a.quiet || env.rank != 0);
  const int threads = c.threads(env.local_size);
  apply_compute_settings(c, env.local_size);
  if (c.i("parallel.ps_servers") > 0) return run_ps_train(c, a, env, restarted);
  const bool lead = env.rank == 0;  // writes the run directory, metrics and checkpoints

  const std::string run = c.run_path();
  const std::string ckpt_root = c.s("checkpoint.dir").empty() ? (fs::path(run) / "checkpoints").string() : c.s("checkpoint.dir");
  if (a.resume && a.restart) throw InputError("--resume and --restart: expected one of them");
  if (a.resume && !a.init_from.empty())
    throw InputError("--resume and --init-from: expected one of them (--resume continues the run's own checkpoints)");
  // Everything that can be wrong with the input is found before anything is written.
  const bool resume = a.resume || (restarted && checkpoint::latest_step_dir(ckpt_root));
  if (!a.init_from.empty()) check_apart("--init-from", a.init_from, "checkpoint.dir", ckpt_root);
  if (c.b("training.keep_zeros") && a.init_from.empty() && !resume)
    throw InputError("training.keep_zeros = true keeps the zeros of the weights training starts from; expected "
                     "--init-from PATH (a pruned checkpoint, loom prune) or --resume");
  Mesh mesh = mesh_coordinates(c, env.rank);
  const bool piped = mesh.pp > 1;
  // Tensor parallelism: this rank builds its piece of every block; the seam's communicator
  // exists once the job has joined (below), before the first forward.
  parallel::TensorParallelSeam seam;
  // A resume loads every weight: the random initialization would be overwritten.
  std::unique_ptr<Task> task = make_task(
      c, mesh_part(c, mesh),
      mesh.tp > 1 ? nn::Shard{.index = mesh.tp_index, .parts = mesh.tp, .seam = &seam, .sequence = c.b("parallel.sequence_parallel")}
                  : nn::Shard{},
      /*init=*/!resume);
  ParamSet& params = task->params();
  // Rank 0 writes the run directory and claims it once the config, data and model are
  // known good and before any checkpoint is read: a second job, or a --resume of a running
  // one, is refused here naming the holder.
  std::optional<RunDirectory> run_dir;
  if (lead) {
    const bool own_ckpt_dir = !c.s("checkpoint.dir").empty();
    if (a.restart && !restarted && own_ckpt_dir && checkpoint::latest_step_dir(ckpt_root))
      throw InputError(cat(ckpt_root, ": checkpoint.dir holds the old run's checkpoints, which --restart would mix with the "
                           "new run's; move it or set another checkpoint.dir"));
    run_dir.emplace(RunDirectory::claim(run, resume || restarted ? RunDirectory::Mode::kResume
                                             : a.restart ? RunDirectory::Mode::kRestart
                                                         : RunDirectory::Mode::kFresh,
                                        own_ckpt_dir ? ckpt_root : ""));
    if (!run_dir->moved_aside().empty()) log_info(cat("--restart: the old ", run, " is now ", run_dir->moved_aside()));
  }

  const optim::OptimizerConfig oc = optimizer_config(c);
  const int64_t steps = c.i("training.steps");
  const optim::ScheduleConfig sched = schedule_config(c);
  const int64_t dp_size = c.i("parallel.dp");
  const int64_t global_batch = c.i("training.global_batch"), micro_batch = c.i("training.micro_batch");
  const int64_t per_rank = global_batch / dp_size, accum = per_rank / micro_batch;
  const auto seed = static_cast<uint64_t>(c.i("job.seed"));

  std::optional<checkpoint::Checkpoint> ck;
  int64_t start_step = 0;
  // [training] precision = "fp16": dynamic loss scaling (docs/numerics.md, "Mixed precision").
  const bool fp16 = c.s("training.precision") == "fp16";
  optim::LossScaler scaler({.init = c.f("training.loss_scale"), .window = c.i("training.loss_scale_window")});
  const std::vector<int64_t> overflow_at = overflow_steps(c.s("debug.overflow_at"));
  if (!overflow_at.empty() && !fp16)
    throw InputError(cat("debug.overflow_at is set but training.precision = \"", c.s("training.precision"),
                         "\": only fp16 scales the loss and skips an overflowing step; expected training.precision = \"fp16\""));
  double load_s = 0;  // reading the weights (then the optimizer state, after joining)
  // NaN or Inf in the weights or the optimizer state this rank read would only spread
  // through training. Checked after each load; a report is given once.
  std::string nonfinite_seen;
  auto check_finite = [&] {
    const std::string bad = ck->nonfinite_report();
    if (bad.empty() || bad == nonfinite_seen) return;
    nonfinite_seen = bad;
    if (!a.allow_nonfinite)
      throw InputError(cat(bad, "; training from it would spread them: resume from an earlier checkpoint, or pass "
                                "--allow-nonfinite"));
    log_warn(cat(bad, "; resuming anyway (--allow-nonfinite)"));
  };
  if (resume) {
    ck.emplace(parallel::open_for_resume(ckpt_root, task->model_json(), seed, steps, global_batch));
    const checkpoint::State& saved = ck->state();
    const auto t0 = std::chrono::steady_clock::now();
    ck->load_params(params);
    load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_finite();
    // Only once `latest` has proven good: a refused resume changes nothing.
    if (lead) parallel::set_aside_uncommitted_steps(ckpt_root);
    start_step = saved.step;
    if (fp16 && saved.raw.contains("loss_scale")) {  // absent when the run trained in another precision
      const json& ls = saved.raw["loss_scale"];
      const std::string at = cat(ck->path(), "/state.json: loss_scale");
      if (!ls.is_object() || !ls.contains("scale") || !ls["scale"].is_number() || !ls.contains("clean_steps") ||
          !ls["clean_steps"].is_number_integer())
        throw InputError(cat(at, ": expected {\"scale\": a power of two, \"clean_steps\": an integer}"));
      try {
        scaler.restore(ls["scale"].get<double>(), ls["clean_steps"].get<int64_t>());
      } catch (const InputError& e) {
        throw InputError(cat(at, ": ", e.what()));
      }
    }
  }
  if (!a.init_from.empty() && !resume) {
    // Weights only, this rank's piece of each, from whatever layout (or file) holds them.
    ck = checkpoint::Checkpoint::open(a.init_from);
    ck->load_params(params);
    check_finite();
    log_info(cat("initialized from ", ck->path()));
  }

  std::unique_ptr<comm::TcpStoreServer> server;
  std::unique_ptr<comm::Store> store;
  auto world = comm::join_world(
      env, {.transport = c.s("comm.transport"), .timeout = std::chrono::milliseconds(static_cast<int64_t>(c.f("comm.timeout_s") * 1000))},
      server, store);
  check_same_layout(*world, c);
  if (mesh.split()) split_mesh(*world, mesh);
  if (mesh.tp > 1) seam.attach(*mesh.tpc);
  comm::Communicator& dp_comm = mesh.split() ? *mesh.dp : *world;
  parallel::DataParallel dp(dp_comm, params, oc,
                            {.zero = static_cast<int>(c.i("parallel.zero")), .bucket_mb = c.f("parallel.bucket_mb"),
                             .deterministic = c.b("parallel.deterministic"),
                             .grad_dtype = c.s("comm.grad_dtype") == "bf16" ? DType::kBF16 : DType::kF32,
                             .param_dtype = c.s("comm.param_dtype") == "bf16" ? DType::kBF16 : DType::kF32},
                            piped ? std::vector<int64_t>{0, params.numel()} : task->block_offsets());
  // Pipeline stages: the executor runs the schedule's list and tells DataParallel when each
  // backward piece is done; ranks without a pipeline report blocks through the hook below.
  std::unique_ptr<parallel::Pipeline> pipe;
  // Rank 0 with pipeline stages or tensor-parallel pieces: every stage's or piece's weights,
  // gathered to evaluate or save and freed after, so that between those moments rank 0
  // holds only its own.
  std::optional<nn::Gpt> whole;
  if (mesh.split()) dp.set_stage_groups(stage_groups(mesh, params));
  if (piped) {
    pipe = std::make_unique<parallel::Pipeline>(
        *mesh.pipe,
        parallel::make_schedule(parallel::schedule_kind_named(c.s("parallel.pp_schedule")), mesh.pp,
                                static_cast<int>(accum), mesh.v),
        *task->gpt(), mesh.stage_ranks());
    if (task->distilling())
      pipe->set_loss_targets([&](const Tensor& tokens, nn::CrossEntropyCtx& loss) { task->set_distill_targets(tokens, loss); });
  }
  // Collective over the pipeline or the tensor-parallel pieces (replica 0 only; the others
  // hold the same weights): rank 0 builds `whole`, to evaluate.
  auto gather_whole = [&]() {
    if (!mesh.split() || mesh.dp_index != 0) return;
    if (lead) whole.emplace(gpt_config(c));
    ParamSet* to = lead ? &whole->params() : nullptr;
    if (!piped) {
      gather_pieces(mesh, gpt_config(c), {}, params, to);
    } else if (mesh.tp == 1) {
      gather_stages(mesh, gpt_config(c), params, to);
    } else {
      // Pieces onto each stage's first piece, then those stages onto rank 0.
      const nn::GptPart part = mesh_part(c, mesh);
      std::optional<nn::Gpt> stage;
      if (mesh.tp_index == 0) stage.emplace(gpt_config(c), DType::kF32, part);
      gather_pieces(mesh, gpt_config(c), part, params, stage ? &stage->params() : nullptr);
      if (mesh.tp_index == 0) gather_stages(mesh, gpt_config(c), stage->params(), to);
    }
  };
  // [profile] trace_steps: a Chrome trace of those steps, merged over the ranks.
  const std::vector<int64_t> trace_steps = obs::parse_steps(c.s("profile.trace_steps"));
  std::optional<obs::Trace> trace;
  std::optional<StepTracer> tracer;
  bool tracing = false;
  if (!piped)
    task->set_block_hook([&](int block, BlockPhase phase) {
      if (tracing) tracer->on_block(block, phase);
      else dp.on_block(block, phase);
    });
  if (ck && resume) {
    const auto t0 = std::chrono::steady_clock::now();
    optim::RangeState st = dp.kept_optimizer_state();  // in place, only what this rank keeps
    ck->load_optimizer(params, st);
    check_finite();
    dp.set_optimizer_steps(st.steps);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() + load_s;
    log_info(cat("resuming from ", ck->path(), " at step ", start_step, ": this rank read ",
                 static_cast<double>(ck->bytes_read()) / (1 << 20), " MiB of shards in ", s * 1e3, " ms (",
                 static_cast<double>(ck->bytes_read()) / s / 1e9, " GB/s)"));
  }
  // The files read stay in memory as long as the checkpoint is open: not during training.
  const std::string resumed_from = ck && resume ? ck->path() : "";
  ck.reset();
  dp.sync_params();
  // [training] keep_zeros: the weights and biases a pruned checkpoint zeroed stay zero.
  std::vector<uint8_t> zeros_kept;
  if (c.b("training.keep_zeros")) zeros_kept = zero_mask(params);
  if (!trace_steps.empty()) {
    comm::barrier(*world);  // every rank's origin: the barrier's exit
    trace.emplace(obs::Trace::Clock::now());
    tracer.emplace(*trace, dp);
  }
  const parallel::StateBytes mem0 = dp.state_bytes();
  auto mb = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };

  const std::string metrics_path = (fs::path(run) / "metrics.jsonl").string();
  std::optional<obs::MetricsFile> metrics;
  if (lead) {
    fs::create_directories(fs::path(run) / "logs");
    write_file_atomic((fs::path(run) / "config.toml").string(), c.to_toml());
    const int64_t reached = resume || restarted ? truncate_metrics(metrics_path, start_step) : 0;
    metrics.emplace(metrics_path);
    if (restarted)
      log_info(cat("elastic generation ", elastic->generation, " (", elastic->reason, "): ",
                   resume ? cat("resumed from step ", start_step) : std::string("no checkpoint yet, started afresh"), " on ",
                   world->size(), " rank(s); ", std::max<int64_t>(reached - start_step, 0),
                   " step(s) lost (the metrics had reached step ", reached, ")"));
  }

  data::Sampler sampler(task->train_items(), seed);
  obs::Progress progress(steps, c.i("job.log_every"), a.quiet || !lead);
  log_info(cat("training ", c.s("model.preset"), " (", params.numel(), " parameters) on ", c.s("data.train"), ": ",
               steps, " steps of ", global_batch, " x ", task->tokens_per_item(), " tokens, ", dp_size,
               " data-parallel rank(s)",
               mesh.tp > 1 ? cat(" x ", mesh.tp, " tensor-parallel ranks") : std::string(),
               piped ? cat(" x ", mesh.pp, " pipeline stages (", c.s("parallel.pp_schedule"), ", ", accum, " micro-batches",
                           mesh.v > 1 ? cat(", ", mesh.v, " chunks per stage") : std::string(), ")")
                     : std::string(),
               " x ", threads, " thread(s), ZeRO ", c.i("parallel.zero"),
               c.b("parallel.deterministic") ? ", deterministic" : "", "; run directory ", run));
  if (!memory_plan_line.empty()) log_info("planned " + memory_plan_line);
  log_info(cat("model state per rank: parameters ", mb(mem0.params), " MiB, gradients ", mb(mem0.grads),
               " MiB, optimizer ", mb(mem0.optimizer), " MiB"));
  // Stages hold different parts: after the first step (every buffer touched) rank 0 logs
  // every rank's. Collective.
  auto log_stage_state = [&](const parallel::StateBytes& mem) {
    int64_t mine[4] = {params.numel(), mem.params, mem.grads, mem.optimizer};
    std::vector<int64_t> all(4 * static_cast<size_t>(world->size()));
    comm::all_gather(*world, {.input = mine, .output = all.data(), .count = 4, .dtype = DType::kI64});
    for (int r = 0; r < world->size(); ++r) {
      const int64_t* x = all.data() + 4 * r;
      log_info(cat("model state of rank ", r, " (", mesh_coordinates(c, r).where(), "): ", x[0],
                   " parameters; parameters ", mb(x[1]), " MiB, gradients ", mb(x[2]), " MiB, optimizer ", mb(x[3]), " MiB"));
    }
  };
  const double tokens_per_step = static_cast<double>(global_batch * task->tokens_per_item());
  double ema_step_s = 0, comm_ms_total = 0, exposed_ms_total = 0, step_s_total = 0, bubble_total = 0, predicted_total = 0,
         replayed_total = 0;
  EvalResult last_eval;

  std::string last_checkpoint = resumed_from;
  const json layout = {{"world", world->size()}, {"dp", dp_size}, {"tp", mesh.tp}, {"pp", mesh.pp},
                       {"virtual_stages", mesh.v}, {"zero", c.i("parallel.zero")},
                       {"sequence_parallel", c.b("parallel.sequence_parallel")}};
  install_fault_hook(c.s("debug.fault_at"), env.rank);
  parallel::CheckpointSaver saver(*world, c.b("checkpoint.async"));
  if (c.b("checkpoint.async")) saver.prepare(share_bytes(mesh, params, dp));
  auto last_save = std::chrono::steady_clock::now();
  // Collective: the time this rank's training stopped for the save (with async, the copy of
  // its share; otherwise the whole write).
  auto save = [&](int64_t step, bool loss_finite) {
    const auto t0 = std::chrono::steady_clock::now();
    dp.materialize_params();  // collective: every rank takes part
    json rng = {{"generator", "xoshiro256** (splitmix64-seeded)"}, {"seed", seed},
                {"streams", {{"init", 1}, {"data_epoch_e", "1000 + e"}}},
                {"data_epoch", step * global_batch / task->train_items()}};
    json state = {{"data_cursor", step * global_batch}, {"rng", rng}, {"model", task->model_json()},
                  {"config", c.to_toml()}};
    if (fp16) state["loss_scale"] = {{"scale", scaler.scale()}, {"clean_steps", scaler.clean_steps()}};
    const std::string dir =
        saver.save([&](checkpoint::PieceArena& arena) { return parallel::rank_share(mesh, params, dp, arena); },
                   {.root = ckpt_root, .step = step, .state = state, .layout = layout,
                    .options = {.keep = static_cast<int>(c.i("checkpoint.keep")), .loss_finite = loss_finite}});
    last_save = std::chrono::steady_clock::now();
    if (!loss_finite)  // prune keeps the newest finite checkpoint whatever checkpoint.keep says
      log_warn(cat("step ", step, ": the loss is not finite; saving it, and the newest finite checkpoint is kept "
                   "whatever checkpoint.keep says"));
    if (!dir.empty()) {
      last_checkpoint = dir;
      progress.note(cat("checkpoint ", dir));
    }
    return std::chrono::duration<double, std::milli>(last_save - t0).count();
  };
  auto saved = [&](const std::optional<std::string>& dir) {  // an async save that completed
    if (!dir) return;
    last_checkpoint = *dir;
    progress.note(cat("checkpoint ", *dir));
  };
  struct sigaction term{};
  term.sa_handler = on_terminate;
  term.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &term, nullptr);
  int exit_code = 0;
  int64_t end_step = steps;  // earlier after SIGTERM
  const int64_t delay_ms = step_delay_ms(c.s("debug.delay_ms"), env.rank);
  obs::StragglerWatch stragglers(world->size());
  double ckpt_stall_ms = -1;  // of the save after the last step, for the next step's line
  std::optional<std::chrono::steady_clock::time_point> terminate_seen;

  for (int64_t step = start_step; step < steps; ++step) {
    try {
      auto t0 = std::chrono::steady_clock::now();
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      tracing = trace && std::binary_search(trace_steps.begin(), trace_steps.end(), step + 1);
      if (tracing) {
        tracer->push(cat("step ", step + 1));
        dp.set_comm_observer([&](const parallel::CommSpan& s) { tracer->on_comm(s); });
        if (mesh.tp > 1) seam.set_observer([&](const parallel::CommSpan& s) { tracer->on_comm(s); });
        if (piped)  // each compute action and each wait for a neighbour: the schedule as it ran
          pipe->set_observer([&](const parallel::PipeSpan& s) { trace->span(obs::Trace::kTraining, s.what, s.begin, s.end); });
      }
      dp.begin_step();
      // fp16: the loss times the scale (times 2^40 in a step debug.overflow_at names).
      const double loss_scale =
          !fp16 ? 1 : scaler.scale() * (std::binary_search(overflow_at.begin(), overflow_at.end(), step + 1) ? 0x1p40 : 1);
      const double backward_scale = loss_scale / static_cast<double>(accum * dp_size);
      std::vector<double> micro_losses;
      if (piped) {
        // This replica's shard of the global batch, micro-batch by micro-batch, through the stages.
        auto batch = [&](int m) {
          std::vector<int64_t> items(static_cast<size_t>(micro_batch));
          for (int64_t i = 0; i < micro_batch; ++i)
            items[i] = sampler.item(step * global_batch + mesh.dp_index * per_rank + m * micro_batch + i);
          return task->batch(items);
        };
        if (tracing) tracer->push(cat("pipeline ", c.s("parallel.pp_schedule"), ", stage ", mesh.stage));
        micro_losses = pipeline_step(mesh, *pipe, dp, batch, micro_batch, c.i("model.seq_len"), backward_scale);
        if (tracing) tracer->pop();
      }
      for (int64_t m = 0; m < (piped ? 0 : accum); ++m) {
        if (tracing) tracer->push(cat("micro-step ", m));
        dp.begin_micro_step(m == accum - 1);
        // This rank's shard of the global batch: items [rank * per_rank, (rank + 1) * per_rank).
        std::vector<int64_t> items(static_cast<size_t>(micro_batch));
        for (int64_t i = 0; i < micro_batch; ++i)
          items[i] = sampler.item(step * global_batch + dp.rank() * per_rank + m * micro_batch + i);
        micro_losses.push_back(task->micro_step(items, backward_scale));
        dp.end_micro_step();
        if (tracing) tracer->pop();
      }
      const double loss = dp.mean_loss(micro_losses);
      const PipelineBubble bubble = piped ? pipeline_bubble(mesh, *pipe) : PipelineBubble{};
      const double lr = optim::lr_at(sched, step);
      if (tracing) tracer->push("optimizer step");
      const double grad_norm = dp.finish_step(lr, c.f("training.grad_clip"), loss_scale);
      if (tracing) tracer->pop();
      // fp16: gradients that overflowed skip the step (finish_step updated nothing) and halve
      // the scale; a finite loss with overflowing gradients at the smallest scale stops.
      const bool skipped = fp16 && std::isfinite(loss) && !std::isfinite(grad_norm);
      if (fp16 && !scaler.update(skipped))
        throw RuntimeError(cat("step ", step + 1, ": fp16 gradients overflow even at loss scale ", scaler.scale(),
                               ", the smallest; train in training.precision = \"bf16\" (f32's range) or \"fp32\", or "
                               "with a lower training.lr"));
      if (skipped)
        log_warn(cat("step ", step + 1, ": fp16 gradients overflowed at loss scale ", loss_scale,
                     "; the step is skipped and the scale lowered to ", scaler.scale()));
      // A loss or gradient norm that is not finite stops the run at this step, before any
      // update or checkpoint (every rank sees the same global loss and norm).
      if (!skipped && (!std::isfinite(loss) || !std::isfinite(grad_norm))) {
        const std::string first = dp.first_nonfinite_gradient();  // collective over the group
        throw RuntimeError(cat("the loss (", loss, ") or the gradient norm (", grad_norm, ") is not finite; ",
                               first.empty() ? std::string("every gradient is finite")
                               : c.b("parallel.deterministic")
                                   ? cat("the first gradient deterministic mode cannot sum exactly (not finite, or 2^31 "
                                         "or more in magnitude) is ", first, mesh.split() ? " (this rank's part of the model)" : "")
                                   : cat("the first non-finite gradient is ", first,
                                         mesh.split() ? " (this rank's part of the model)" : ""),
                               ". The run stops before updating; ",
                               last_checkpoint.empty() ? std::string("no checkpoint was written")
                                                       : cat("the last checkpoint, ", last_checkpoint, ", is intact"),
                               " (a lower training.lr or a training.grad_clip may help)"));
      }
      if (!zeros_kept.empty()) apply_zero_mask(params, zeros_kept);
      const parallel::CommStats cs = dp.take_stats();
      // [job] mem_limit_mb: the rank's peak resident memory, checked after every step.
      if (const double limit = c.f("job.mem_limit_mb"); limit > 0 && peak_rss_mb() > limit)
        throw RuntimeError(cat("used ", static_cast<int64_t>(peak_rss_mb()), " MiB at its peak, over job.mem_limit_mb = ",
                               limit, " MiB per rank"));
      const parallel::StateBytes mem = dp.state_bytes();  // resident pages, after the step
      if (mesh.split() && step == start_step) log_stage_state(mem);
      const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ema_step_s = step == start_step ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
      if (step > start_step) {  // the first step warms caches and connections
        comm_ms_total += cs.comm_ms;
        exposed_ms_total += cs.exposed_ms;
        step_s_total += step_s;
        bubble_total += bubble.measured;
        predicted_total += bubble.predicted;
        replayed_total += bubble.replayed;
      }

      const int64_t done = step + 1;
      obs::JsonLine line;
      line.add("step", done).add("loss", loss).add("lr", lr).add("grad_norm", grad_norm)
          .add("tokens", static_cast<int64_t>(tokens_per_step)).add("step_ms", step_s * 1e3)
          .add("tokens_per_s", tokens_per_step / step_s).add("mem_peak_mb", peak_rss_mb())
          .add("comm_ms", cs.comm_ms).add("exposed_comm_ms", cs.exposed_ms).add("comm_bytes", cs.bytes)
          .add("mem_params_mb", mb(mem.params)).add("mem_grads_mb", mb(mem.grads))
          .add("mem_optimizer_mb", mb(mem.optimizer));
      if (fp16) line.add("loss_scale", loss_scale).add("skipped", static_cast<int64_t>(skipped));
      if (piped) {
        const parallel::PipelineStats& ps = pipe->stats();
        line.add("pp_bubble", bubble.measured)
            .add("pp_bubble_predicted", bubble.predicted)
            .add("pp_bubble_replayed", bubble.replayed);
        line.add("pp_wait_ms", ps.wait_ms).add("pp_comm_ms", ps.send_ms).add("pp_comm_bytes", ps.sent_bytes);
      }
      // This rank's compute: its step less its waits for the others.
      double busy_ms = step_s * 1e3 - cs.exposed_ms - (piped ? pipe->stats().wait_ms : 0);
      if (mesh.tp > 1) {
        const parallel::TensorParallelSeam::Stats ts = seam.take_stats();  // this step's (evaluation runs on `whole`)
        line.add("tp_comm_ms", ts.ms).add("tp_exposed_comm_ms", ts.exposed_ms).add("tp_comm_bytes", ts.bytes);
        line.add("tp_comm_calls", ts.calls);
        busy_ms -= ts.exposed_ms;
      }
      const int64_t eval_every = c.i("training.eval_every");
      const bool eval = task->has_validation() && ((eval_every > 0 && done % eval_every == 0) || done == steps);
      if (eval) dp.materialize_params();  // collective; rank 0 alone evaluates
      if (eval) gather_whole();
      if (lead && eval) {
        if (tracing) tracer->push("evaluate");
        last_eval = task->evaluate(c.i("training.eval_steps") * micro_batch, whole ? &*whole : nullptr);
        whole.reset();
        if (tracing) tracer->pop();
        line.add("val_loss", last_eval.loss);
        if (last_eval.accuracy >= 0) line.add("val_accuracy", last_eval.accuracy);
        progress.note(cat("step ", done, ": val_loss ", last_eval.loss,
                          last_eval.accuracy >= 0 ? cat(", val_accuracy ", last_eval.accuracy) : std::string()));
      }
      // Whether to save now: every checkpoint.every steps, at the end, when checkpoint.every_s
      // have passed on rank 0's clock, or when any rank got SIGTERM. The last two need every
      // rank to agree, and rank 0 watches every rank's compute time for stragglers: one small
      // all-gather a step.
      saved(saver.poll());
      const std::array<double, 4> mine = {
          g_terminate ? 1.0 : 0.0,
          lead && c.f("checkpoint.every_s") > 0 &&
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() >=
                      c.f("checkpoint.every_s")
              ? 1.0
              : 0.0,
          busy_ms, g_resize ? 1.0 : 0.0};
      if (g_terminate && !terminate_seen) terminate_seen = std::chrono::steady_clock::now();
      std::vector<double> every_rank(4 * static_cast<size_t>(world->size()));
      comm::all_gather(*world, {.input = mine.data(), .output = every_rank.data(), .count = 4, .dtype = DType::kF64});
      std::array<bool, 3> flags = {false, false, false};  // SIGTERM, every_s due, resize asked
      std::vector<double> busy;
      for (int r = 0; r < world->size(); ++r) {
        flags[0] = flags[0] || every_rank[4 * r] != 0;
        flags[1] = flags[1] || every_rank[4 * r + 1] != 0;
        flags[2] = flags[2] || every_rank[4 * r + 3] != 0;
        busy.push_back(every_rank[4 * r + 2]);
      }
      double median = 0;
      if (lead && world->size() > 1)
        for (int r : stragglers.update(busy, &median))
          log_warn(cat("step ", done, ": rank ", r, " (", mesh_coordinates(c, r).where(), ") is a straggler: ", busy[r],
                       " ms of compute against the median ", median, " ms, over 3x for 3 steps in a row (not stopped)"));
      const int64_t every = c.i("checkpoint.every");
      const bool stop = flags[0] && done < steps;
      // The step's line goes out before its checkpoint: a checkpoint never outlives the
      // metrics of the steps it holds (a crash in between loses neither). The save's stall
      // is therefore reported on the next step's line.
      if (ckpt_stall_ms >= 0) line.add("ckpt_stall_ms", ckpt_stall_ms);
      ckpt_stall_ms = -1;
      if (restarted && step == start_step) {
        const double since_s = static_cast<double>(unix_ms() - elastic->since_unix_ms) / 1e3;
        line.add("elastic_restart_s", since_s);
        log_info(cat("elastic generation ", elastic->generation, ": first step done ", since_s,
                     " s after the previous generation ended"));
      }
      if (metrics) metrics->write(line);
      progress.update(done, loss, tokens_per_step / step_s, ema_step_s);
      const bool saving = (every > 0 && done % every == 0) || done == steps || flags[1] || stop;
      if (saving) {
        if (tracing) tracer->push("checkpoint");
        ckpt_stall_ms = save(done, std::isfinite(loss));
        if (tracing) tracer->pop();
      }
      if (saving && flags[2] && !stop && done < steps) {
        saved(saver.wait());
        log_info(cat("saved step ", done, " of ", steps, " (", last_checkpoint,
                     "); stopping so that the elastic launcher restarts the job with the ranks waiting to join"));
        end_step = done;
        exit_code = kExitForResize;
      }
      if (stop) {
        saved(saver.wait());
        if (!terminate_seen) terminate_seen = std::chrono::steady_clock::now();  // another rank's signal
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - *terminate_seen).count();
        log_info(cat("SIGTERM: saved step ", done, " of ", steps, " (", last_checkpoint, ") ", took,
                     " s after the signal; stopping. `loom train ... --resume` continues from it"));
        if (took > c.f("checkpoint.grace_s"))
          log_warn(cat("the save after SIGTERM took ", took, " s, over checkpoint.grace_s = ", c.f("checkpoint.grace_s"),
                       " s: the job may be killed before it ends next time"));
        end_step = done;
      }
      if (tracing) {
        tracer->pop();  // the step
        dp.set_comm_observer(nullptr);
        seam.set_observer(nullptr);
        if (piped) pipe->set_observer(nullptr);
        tracing = false;
        if (done == trace_steps.back() || end_step == done) {
          const std::string path = (fs::path(run) / "trace.json").string();
          write_merged_trace(*world, *trace, path);
          progress.note(cat("trace of step(s) ", c.s("profile.trace_steps"), " of ", world->size(), " rank(s): ", path));
        }
      }
    } catch (const RuntimeError& e) {
      // Names the step (and the stage), so a dead peer's line says when and where it
      // happened, and points to this rank's flight recorder.
      const std::string flight = dump_flight_record(
          run, env.rank, step + 1, e.what(),
          {{"world", world.get()}, {"dp", mesh.dp.get()}, {"pipe", mesh.pipe.get()}, {"tied", mesh.tied.get()},
           {"tp", mesh.tpc.get()}, {"mp", mesh.mp.get()}});
      throw RuntimeError(cat("rank ", env.rank, mesh.split() ? cat(" (", mesh.where(), ")") : "", " at step ", step + 1,
                             ": ", e.what(), flight.empty() ? std::string() : cat(" (flight recorder: ", flight, ")")));
    }
    if (end_step < steps) break;
  }
  saved(saver.wait());  // the last save complete before the run reports done
  progress.finish();
  dp.materialize_params();
  if (lead && end_step == steps && task->has_validation() && last_eval.items > 0 && last_eval.accuracy >= 0) {
    // A full pass over the test set for the final figure.
    EvalResult full = task->evaluate(0);
    std::printf("test accuracy %.4f over %lld images (loss %.4f)\n", full.accuracy,
                static_cast<long long>(full.items), full.loss);
  }
  const int64_t timed = end_step - start_step - 1;
  if (lead && piped && timed > 0) {
    // The data-parallel scaling figure below assumes every rank computes the whole step,
    // which stages do not: the pipeline's own summary instead.
    std::printf("pipeline: dp %lld x pp %d%s = %d ranks (%s, %lld micro-batches), %.0f tokens/s, step %.1f ms, bubble %.1f%% "
                "(the simulator predicts %.1f%% from the measured mean costs, %.1f%% replaying each action)%s\n",
                static_cast<long long>(dp_size), mesh.pp, mesh.tp > 1 ? cat(" x tp ", mesh.tp).c_str() : "", world->size(),
                c.s("parallel.pp_schedule").c_str(),
                static_cast<long long>(accum), tokens_per_step * timed / step_s_total, step_s_total * 1e3 / static_cast<double>(timed),
                100.0 * bubble_total / static_cast<double>(timed), 100.0 * predicted_total / static_cast<double>(timed),
                100.0 * replayed_total / static_cast<double>(timed),
                dp_size > 1 ? cat(", gradient communication over replicas ", comm_ms_total / static_cast<double>(timed),
                                  " ms/step of which ", exposed_ms_total / static_cast<double>(timed), " ms exposed").c_str()
                            : "");
  } else if (lead && dp_size > 1 && timed > 0) {
    const double step_ms = step_s_total * 1e3 / static_cast<double>(timed);
    std::printf("data parallel: %lld ranks, %.0f tokens/s (%.0f per rank), step %.1f ms, gradient communication "
                "%.1f ms/step of which %.1f ms exposed (%.1f%% of the step)\n",
                static_cast<long long>(dp_size), tokens_per_step * timed / step_s_total,
                tokens_per_step * timed / step_s_total / static_cast<double>(dp_size), step_ms,
                comm_ms_total / static_cast<double>(timed), exposed_ms_total / static_cast<double>(timed),
                100.0 * exposed_ms_total / (step_s_total * 1e3));
    const double efficiency = 1.0 - exposed_ms_total / (step_s_total * 1e3);
    std::printf("scaling: %.2fx one rank's tokens/s at the same per-rank compute speed (efficiency %.1f%%, the share "
                "of the step not spent waiting on gradients)\n",
                static_cast<double>(dp_size) * efficiency, 100.0 * efficiency);
  }
  if (lead) std::printf("run directory: %s\n", printable(run).c_str());
  return exit_code;
}

}  // namespace loom::app
