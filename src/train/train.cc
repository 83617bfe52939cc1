// The trainer's start (loom/train/train.h): builds the model, claims the run directory,
// loads the weights, joins the job and lays the model out; train_step.cc keeps the run's
// books: metrics, evaluation, checkpoints, signals, traces (docs/architecture.md walks a step).
#include <chrono>
#include <filesystem>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/core/log.h"
#include "loom/checkpoint/outputs.h"
#include "loom/serve/prune.h"
#include "loom/gpu/gpu.h"
#include "train_run.h"
#include "loom/train/debug_hooks.h"

namespace loom::train {
namespace fs = std::filesystem;
using json = nlohmann::json;

TrainRun::TrainRun(const RunOptions& a, RunStart& job)
    : a_(a),
      env_(job.env),
      t_(job.tc),
      job_(job),
      lead_(job.env.rank == 0 && job.ps_join_world == 0),
      // An elastic generation, or --resume-if-saved, resumes when the run has a checkpoint.
      in_place_(job.restarted || (a.resume_if_saved && fs::exists(job.tc.job.run))),
      resume_(a.resume || (in_place_ && checkpoint::latest_step_dir(t_.checkpoint.root))),
      steps_(job.tc.training.steps),
      global_batch_(job.tc.training.global_batch),
      micro_batch_(job.tc.training.micro_batch),
      per_rank_(global_batch_ / job.tc.parallel.layout.dp),
      end_step_(steps_) {
  if (a.resume && a.restart) throw InputError("--resume and --restart: expected one of them");
  if (a.resume_if_saved && (a.resume || a.restart))
    throw InputError("--resume-if-saved with --resume or --restart: expected one of them (it resumes when there is a checkpoint)");
  if (a.resume_if_saved && !a.init_from.empty())
    throw InputError("--resume-if-saved and --init-from: expected one of them");
  if (t_.parallel.ps.servers > 0 && !a.init_from.empty())
    throw InputError("--init-from with parallel.ps_servers > 0: the servers start from the config's initialization or "
                     "--resume; expected no --init-from");
  if (a.resume && !a.init_from.empty())
    throw InputError("--resume and --init-from: expected one of them (--resume continues the run's own checkpoints)");
  // Everything that can be wrong with the input is found before anything is written.
  if (t_.job.cuda) gpu::require_device(0);
  if (!a.init_from.empty()) checkpoint::check_apart("--init-from", a.init_from, "checkpoint.dir", t_.checkpoint.root);
  if (t_.training.keep_zeros && a.init_from.empty() && !resume_)
    throw InputError("training.keep_zeros = true keeps the zeros of the weights training starts from; expected "
                     "--init-from PATH (a pruned checkpoint, loom prune) or --resume");
}

// This rank's part of the model (a pipeline stage) and piece (tensor parallelism: its seam
// is the mesh's, attached once the job has joined). A resume loads every weight: the
// random initialization would be overwritten.
void TrainRun::build_model() {
  if (t_.parallel.ps.servers > 0) {  // whole on every rank; a worker pulls the servers' parameters
    const bool server = job_.ps_join_world == 0 && env_.rank < t_.parallel.ps.servers;
    w_ = make_workload(t_, {}, {}, /*init=*/!(server && resume_), /*lead=*/env_.rank == 0);
    return;
  }
  mesh_ = parallel::Mesh::at(t_.parallel.layout, env_.rank);
  w_ = make_workload(t_, parallel::mesh_part(t_.model.gpt.n_layer, mesh_), mesh_.shard(t_.parallel.sequence_parallel),
                     /*init=*/!resume_, /*lead=*/env_.rank == 0);
}

// Rank 0 writes the run directory and claims it once the config, data and model are known
// good and before any checkpoint is read: a second job, or a --resume of a running one, is
// refused here naming the holder.
void TrainRun::claim_run_dir() {
  // The metrics server listens before anything is written: a port in use is refused first.
  if (t_.metrics.port > 0 && (lead_ || t_.metrics.every_rank)) {
    exporter_.emplace(obs::ExporterOptions{.host = t_.metrics.host,
                                           .port = t_.metrics.port + (t_.metrics.every_rank ? env_.local_rank : 0),
                                           .api_key = t_.metrics.api_key, .rank = rank(), .peak_gflops = t_.metrics.peak_gflops});
    log_info(cat("metrics: http://", t_.metrics.host, ":", exporter_->port(), "/metrics (Prometheus)"));
  }
  if (!lead_) return;
  const bool own_ckpt_dir = t_.checkpoint.own_dir;
  if (a_.restart && !job_.restarted && own_ckpt_dir && checkpoint::latest_step_dir(t_.checkpoint.root))
    throw InputError(cat(t_.checkpoint.root, ": checkpoint.dir holds the old run's checkpoints, which --restart would mix with "
                         "the new run's; move it or set another checkpoint.dir"));
  run_dir_.emplace(checkpoint::RunDirectory::claim(t_.job.run, resume_ || in_place_ ? checkpoint::RunDirectory::Mode::kResume
                                             : a_.restart ? checkpoint::RunDirectory::Mode::kRestart
                                                          : checkpoint::RunDirectory::Mode::kFresh,
                                       own_ckpt_dir ? t_.checkpoint.root : ""));
  if (!run_dir_->moved_aside().empty()) log_info(cat("--restart: the old ", t_.job.run, " is now ", run_dir_->moved_aside()));
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
  if (t_.parallel.ps.servers > 0 && (job_.ps_join_world > 0 || env_.rank >= t_.parallel.ps.servers)) return;  // a worker pulls
  ParamSet& params = w_.model->params();
  if (resume_) {
    ck_.emplace(parallel::open_for_resume(t_.checkpoint.root, w_.model_json(), t_.job.seed, steps_, global_batch_));
    const checkpoint::State& saved = ck_->state();
    const auto t0 = std::chrono::steady_clock::now();
    ck_->load_params(params);
    load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_finite();
    // Only once `latest` has proven good: a refused resume changes nothing.
    if (lead_) parallel::set_aside_uncommitted_steps(t_.checkpoint.root);
    start_step_ = saved.step;
    if (t_.parallel.step.fp16 && saved.raw.contains("loss_scale")) {  // absent when the run trained in another precision
      const json& ls = saved.raw["loss_scale"];
      const std::string at = cat(ck_->path(), "/state.json: loss_scale");
      if (!ls.is_object() || !ls.contains("scale") || !ls["scale"].is_number() || !ls.contains("clean_steps") ||
          !ls["clean_steps"].is_number_integer())
        throw InputError(cat(at, ": expected {\"scale\": a power of two, \"clean_steps\": an integer}"));
      saved_scale_.emplace(ls["scale"].get<double>(), ls["clean_steps"].get<int64_t>());
      try {
        optim::LossScaler(t_.parallel.step.loss_scale).restore(saved_scale_->first, saved_scale_->second);  // checked now
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
  if (t_.parallel.ps.servers > 0) return join_ps();
  world_ = comm::join_world(
      env_, {.transport = t_.comm.transport,
             .timeout = std::chrono::milliseconds(static_cast<int64_t>(t_.comm.timeout_s * 1000))},
      server_, store_);
  check_same_layout(*world_, t_.layout);
  if (mesh_.split()) parallel::split_mesh(*world_, mesh_);
  pm_ = t_.job.cuda ? gpu::parallelize_on_gpu(dynamic_cast<nn::Gpt&>(*w_.model), t_.parallel.step, *world_)
                    : parallel::parallelize(*w_.model, mesh_, *world_, t_.parallel.step);
  if (w_.teacher) {
    const nn::Shard vocab = mesh_.shard(false);
    pm_->set_loss_targets([this, vocab](const Tensor& tokens, nn::CrossEntropyCtx& loss) {
      loss.distill = w_.teacher->targets(tokens, vocab, loss.distill.soft);
    });
  }
  if (saved_scale_) pm_->loss_scaler().restore(saved_scale_->first, saved_scale_->second);
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
  if (t_.training.keep_zeros) zeros_kept_ = serve::zero_mask(w_.model->params());
  if (!t_.profile.steps.empty()) {
    comm::barrier(*world_);  // every rank's origin: the barrier's exit
    trace_.emplace(obs::Trace::Clock::now());
    tracer_.emplace(*trace_);
  }
}

// Rank 0's metrics file and config.toml; every rank's sampler, progress, saver and signals.
void TrainRun::open_outputs() {
  const std::string metrics_path = (fs::path(t_.job.run) / "metrics.jsonl").string();
  if (lead_) {
    fs::create_directories(fs::path(t_.job.run) / "logs");
    write_file_atomic((fs::path(t_.job.run) / "config.toml").string(), t_.toml);
    if (w_.tokenizer) w_.tokenizer->save((fs::path(t_.job.run) / "tokenizer").string());
    const int64_t reached = resume_ || in_place_ ? checkpoint::truncate_metrics(metrics_path, start_step_) : 0;
    steps_lost_ = std::max<int64_t>(reached - start_step_, 0);
    metrics_.emplace(metrics_path);
    events_.emplace((fs::path(t_.job.run) / "events.jsonl").string());
    if (job_.restarted)
      log_info(cat("elastic generation ", job_.elastic->generation, " (", job_.elastic->reason, "): ",
                   resume_ ? cat("resumed from step ", start_step_) : std::string("no checkpoint yet, started afresh"),
                   " on ", world_->size(), " rank(s); ", std::max<int64_t>(reached - start_step_, 0),
                   " step(s) lost (the metrics had reached step ", reached, ")"));
  }
  sampler_.emplace(w_.train->size(), t_.job.seed, w_.train->order());
  if (t_.data.prefetch > 0 && !ps_) {
    const int64_t micro = per_rank_ / micro_batch_;
    prefetch_sampler_.emplace(w_.train->size(), t_.job.seed, w_.train->order());
    prefetcher_.emplace(*w_.train, [this, micro](int64_t n) {
      std::lock_guard lock(prefetch_mu_);
      return items_of(*prefetch_sampler_, n / micro, n % micro);
    }, start_step_ * micro, static_cast<int>(t_.data.prefetch));
  }
  progress_.emplace(steps_, t_.job.log_every, a_.quiet || !lead_);
  tokens_per_step_ = static_cast<double>(global_batch_ * w_.train->tokens_per_example());
  if (ps_) {
    log_ps_start();
    layout_ = {{"world", ps_->world()}, {"ps_servers", ps_->servers()}, {"ps_workers", ps_->workers()},
               {"ps_mode", t_.parallel.ps.mode}, {"dp", ps_->workers()}, {"tp", 1}, {"pp", 1}, {"zero", 0}};
    install_fault_hook(t_.debug.fault_at, rank());
    delay_ms_ = step_delay_ms(t_.debug.delay_ms, rank());
    write_start_event();
    return;
  }
  log_start();
  layout_ = {{"world", world_->size()}, {"dp", mesh_.dp_size}, {"tp", mesh_.tp}, {"pp", mesh_.pp},
             {"virtual_stages", mesh_.v}, {"zero", t_.parallel.zero},
             {"sequence_parallel", t_.parallel.sequence_parallel}};
  install_fault_hook(t_.debug.fault_at, env_.rank);
  saver_.emplace(*world_, t_.checkpoint.async);
  if (t_.checkpoint.async) saver_->prepare(pm_->share_bytes());
  last_save_ = std::chrono::steady_clock::now();
  install_terminate_handler();
  delay_ms_ = step_delay_ms(t_.debug.delay_ms, env_.rank);
  stragglers_.emplace(world_->size());
  write_start_event();
}

// events.jsonl (docs/formats.md): what `loom report` and a reader of the run need beyond the
// steps: each start of the run (fresh, resumed, an elastic generation), its world and what
// a token costs.
void TrainRun::write_start_event() {
  // Model FLOPs of training (forward and backward, recompute not counted) per token.
  const double flops_per_token =
      3.0 * w_.model->forward_flops_per_example() / static_cast<double>(w_.train->tokens_per_example());
  const auto world = static_cast<int64_t>(layout_.value("world", 1));
  if (exporter_ && !events_) exporter_->set_run(flops_per_token, world, 0, 0);
  if (!events_) return;
  const auto unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  obs::JsonLine e;
  e.add_string("event", "start").add("time", unix_s).add("step", start_step_).add("steps", steps_);
  e.add_string("how", job_.restarted ? "elastic restart" : resume_ ? "resumed" : "fresh").add("steps_lost", steps_lost_);
  e.add("world", world).add("dp", static_cast<int64_t>(layout_.value("dp", 1)));
  e.add("tp", static_cast<int64_t>(layout_.value("tp", 1))).add("pp", static_cast<int64_t>(layout_.value("pp", 1)));
  e.add("threads", static_cast<int64_t>(t_.job.threads)).add_string("precision", t_.training.precision_name);
  e.add_json("model", w_.model_json().dump());
  e.add("parameters", w_.model->params().numel());
  e.add("train_flops_per_token", flops_per_token);
  events_->write(e);
  if (!exporter_) return;
  // The run's restarts and steps lost so far: every start but a fresh one, from the file.
  int64_t restarts = 0, lost = 0;
  std::istringstream in(read_file((fs::path(t_.job.run) / "events.jsonl").string()));
  for (std::string l; std::getline(in, l);) {
    const json j = json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("event", "") != "start") continue;
    restarts += j.value("how", "") != "fresh";
    lost += j.value("steps_lost", int64_t{0});
  }
  exporter_->set_run(flops_per_token, world, restarts, lost);
}

void TrainRun::write_end_event() {
  if (!events_) return;
  const auto unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  events_->write(obs::JsonLine().add_string("event", "end").add("time", unix_s).add("step", end_step_).add("exit", static_cast<int64_t>(exit_code_)));
}

void TrainRun::log_start() {
  const parallel::StateBytes mem0 = pm_->state_bytes();
  const bool piped = mesh_.pp > 1;
  log_info(cat("training ", model_name(), " (", w_.model->params().numel(), " parameters) on ", t_.data.train,
               ": ", steps_, " steps of ", global_batch_, " x ", w_.train->tokens_per_example(), " tokens, ",
               mesh_.dp_size, " data-parallel rank(s)",
               mesh_.tp > 1 ? cat(" x ", mesh_.tp, " tensor-parallel ranks") : std::string(),
               piped ? cat(" x ", mesh_.pp, " pipeline stages (", t_.parallel.pp_schedule, ", ", t_.parallel.step.accum,
                           " micro-batches", mesh_.v > 1 ? cat(", ", mesh_.v, " chunks per stage") : std::string(), ")")
                     : std::string(),
               " x ", t_.job.threads, " thread(s), ZeRO ", t_.parallel.zero,
               t_.parallel.deterministic ? ", deterministic" : "", "; run directory ", t_.job.run));
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
    log_info(cat("model state of rank ", r, " (", parallel::Mesh::at(t_.parallel.layout, r).where(), "): ", x[0],
                 " parameters; parameters ", mb(x[1]), " MiB, gradients ", mb(x[2]), " MiB, optimizer ", mb(x[3]), " MiB"));
  }
}

// Collective: the time this rank's training stopped for the save (with async, the copy of
// its share; otherwise the whole write).
json TrainRun::checkpoint_state(int64_t step) const {
  const json rng = {{"generator", "xoshiro256** (splitmix64-seeded)"}, {"seed", t_.job.seed},
                    {"streams", {{"init", 1}, {"data_epoch_e", "1000 + e"}}},
                    {"data_epoch", step * global_batch_ / w_.train->size()}};
  return {{"data_cursor", step * global_batch_}, {"rng", rng}, {"model", w_.model_json()}, {"config", t_.toml}};
}

checkpoint::SaveOptions TrainRun::save_options(bool loss_finite) const {
  checkpoint::SaveOptions o{.keep = t_.checkpoint.keep, .loss_finite = loss_finite};
  if (w_.tokenizer) {  // written by whichever rank commits
    const auto [encoder, merges] = w_.tokenizer->files();
    o.files = {{"tokenizer/encoder.json", encoder}, {"tokenizer/vocab.bpe", merges}};
  }
  return o;
}

double TrainRun::save(int64_t step, bool loss_finite) {
  const auto t0 = std::chrono::steady_clock::now();
  begin_memory_phase();
  json state = checkpoint_state(step);
  if (t_.parallel.step.fp16)
    state["loss_scale"] = {{"scale", pm_->loss_scaler().scale()}, {"clean_steps", pm_->loss_scaler().clean_steps()}};
  const std::string dir =
      saver_->save([&](checkpoint::PieceArena* arena) { return pm_->share(arena); },
                   {.root = t_.checkpoint.root, .step = step, .state = state, .layout = layout_,
                    .options = save_options(loss_finite)});
  last_save_ = std::chrono::steady_clock::now();
  peaks_.ckpt = phase_peak_resident_mb();
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

// Build the model, join the job and lay the model out on its mesh, then loop { step, log,
// evaluate, checkpoint } (TrainRun::step).
int run(const RunOptions& options, RunStart& start) {
  check_config(start.tc);
  apply_compute_settings(start.tc.job);
  TrainRun run(options, start);
  run.build_model();
  run.claim_run_dir();
  run.load_weights();
  run.parallelize();
  run.open_outputs();
  if (run.serves()) return run.serve();
  for (int64_t step = run.start_step(); run.goes_on(step); ++step) run.step(step);
  return run.finish();
}

void check_same_layout(comm::Communicator& world, const std::string& layout) {
  const std::vector<std::string> every = parallel::all_gather_strings(world, layout);
  for (size_t r = 1; r < every.size(); ++r)
    if (every[r] != every[0])
      throw InputError(cat("rank ", r, " was started with the layout \"", every[r], "\" but rank 0 with \"", every[0],
                           "\"; every rank must be given the same [parallel], [training] batch and [model] settings"));
}

}  // namespace loom::train
