// `loom train`'s steps and what follows each: the metrics line, evaluation, the ranks'
// agreement on saving and stopping, checkpoints, traces, and the run's closing summary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/host.h"
#include "loom/core/log.h"
#include "loom/serve/prune.h"
#include "train_run.h"
#include "loom/train/debug_hooks.h"

namespace loom::train {
namespace fs = std::filesystem;
using json = nlohmann::json;

// Whether to save now: every checkpoint.every steps, at the end, when checkpoint.every_s
// have passed on rank 0's clock, or when any rank got SIGTERM. The last two need every rank
// to agree, and rank 0 watches every rank's compute time for stragglers and puts every
// rank's memory peaks of the step's phases into `line`: one small all-gather a step (`done`
// steps done). Returns whether any rank got SIGTERM, has checkpoint.every_s due, or was
// asked to resize.
std::array<bool, 3> TrainRun::agree(int64_t done, double busy_ms, obs::JsonLine& line) {
  constexpr size_t kN = 7;
  const std::array<double, kN> mine = {
      terminate_requested() ? 1.0 : 0.0,
      lead_ && t_.checkpoint.every_s > 0 &&
              std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
                  t_.checkpoint.every_s
          ? 1.0
          : 0.0,
      busy_ms, resize_requested() ? 1.0 : 0.0, peaks_.step, peaks_.eval, peaks_.ckpt};
  if (terminate_requested() && !terminate_seen_) terminate_seen_ = std::chrono::steady_clock::now();
  std::vector<double> every_rank(kN * static_cast<size_t>(world_->size()));
  comm::all_gather(*world_, {.input = mine.data(), .output = every_rank.data(), .count = kN, .dtype = DType::kF64});
  std::array<bool, 3> flags = {false, false, false};  // SIGTERM, every_s due, resize asked
  std::vector<double> busy, step_peak, eval_peak, ckpt_peak;
  for (int r = 0; r < world_->size(); ++r) {
    const double* x = every_rank.data() + kN * r;
    flags[0] = flags[0] || x[0] != 0;
    flags[1] = flags[1] || x[1] != 0;
    flags[2] = flags[2] || x[3] != 0;
    busy.push_back(x[2]);
    step_peak.push_back(x[4]);
    eval_peak.push_back(x[5]);
    ckpt_peak.push_back(x[6]);
  }
  // Per rank (docs/formats.md, metrics.jsonl): its compute, ms; MiB, this step's memory peak,
  // its evaluation's, the last save's.
  line.add("compute_ms", busy);
  line.add("mem_step_peak_mb", step_peak);
  if (peaks_.eval >= 0) line.add("mem_eval_peak_mb", eval_peak);
  if (peaks_.ckpt >= 0) line.add("mem_ckpt_peak_mb", ckpt_peak);
  peaks_.eval = peaks_.ckpt = -1;
  double median = 0;
  if (lead_ && world_->size() > 1)
    for (int r : stragglers_->update(busy, &median))
      log_warn(cat("step ", done, ": rank ", r, " (", parallel::Mesh::at(t_.parallel.layout, r).where(), ") is a straggler: ", busy[r],
                   " ms of compute against the median ", median, " ms, over 3x for 3 steps in a row (not stopped)"));
  return flags;
}

bool TrainRun::goes_on(int64_t step) const {
  return ps_ ? !pm_->run_over() : step < steps_ && end_step_ == steps_;
}

// One optimizer step and what follows it: the metrics line, an evaluation, a checkpoint.
// A RuntimeError (a dead peer, a stall, a loss that is not finite) names the step and the
// rank's place, and points to this rank's flight recorder. (A parameter-server worker's:
// train_ps.cc.)
void TrainRun::step(int64_t step) {
  if (ps_) return ps_step(step);
  try {
    train_step(step);
  } catch (const RuntimeError& e) {
    const std::string flight = parallel::dump_flight_record(
        t_.job.run, env_.rank, step + 1, e.what(),
        {{"world", world_.get()}, {"dp", mesh_.dp.get()}, {"pipe", mesh_.pipe.get()}, {"tied", mesh_.tied.get()},
         {"tp", mesh_.tpc.get()}, {"mp", mesh_.mp.get()}});
    throw RuntimeError(cat("rank ", env_.rank, mesh_.split() ? cat(" (", mesh_.where(), ")") : "", " at step ", step + 1,
                           ": ", e.what(), flight.empty() ? std::string() : cat(" (flight recorder: ", flight, ")")));
  }
}

// This replica's shard of the global batch: items [replica * per_rank, (replica + 1) *
// per_rank), micro-batch m of them.
std::vector<int64_t> TrainRun::items_of(data::Sampler& sampler, int64_t step, int64_t m) const {
  const int replica = pm_->replica();
  std::vector<int64_t> items(static_cast<size_t>(micro_batch_));
  for (int64_t i = 0; i < micro_batch_; ++i)
    items[i] = sampler.item(step * global_batch_ + replica * per_rank_ + m * micro_batch_ + i);
  return items;
}

void TrainRun::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t done = step + 1;
  begin_memory_phase();
  if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
  const bool tracing = trace_ && std::binary_search(t_.profile.steps.begin(), t_.profile.steps.end(), done);
  if (tracing) {
    tracer_->push(cat("step ", done));
    pm_->set_tracer(&*tracer_);
  }
  const double lr = optim::lr_at(t_.schedule, step);
  double data_wait_ms = 0;  // the step's waits for its batches
  const parallel::StepResult r = pm_->step(done, [&](int64_t m) {
    if (tracing) tracer_->push("data wait");
    const auto t_data = std::chrono::steady_clock::now();
    data::Batch b = prefetcher_ ? prefetcher_->take(step * (per_rank_ / micro_batch_) + m, nullptr)
                                : w_.train->batch(items_of(*sampler_, step, m));
    data_wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_data).count();
    if (tracing) tracer_->pop();
    return b;
  }, lr);
  // A loss or gradient norm that is not finite stops the run at this step, before any
  // update or checkpoint.
  if (!r.nonfinite.empty())
    throw RuntimeError(cat(r.nonfinite, ". The run stops before updating; ",
                           last_checkpoint_.empty() ? std::string("no checkpoint was written")
                                                    : cat("the last checkpoint, ", last_checkpoint_, ", is intact"),
                           " (a lower training.lr or a training.grad_clip may help)"));
  if (!zeros_kept_.empty()) serve::apply_zero_mask(w_.model->params(), zeros_kept_);
  peaks_.step = phase_peak_resident_mb();
  // [job] mem_limit_mb: the rank's peak resident memory, checked after every step.
  if (const double limit = t_.job.mem_limit_mb; limit > 0 && peak_resident_mb() > limit)
    throw RuntimeError(cat("used ", static_cast<int64_t>(peak_resident_mb()), " MiB at its peak, over job.mem_limit_mb = ",
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
      .add("tokens_per_s", tokens_per_step_ / step_s).add("mem_peak_mb", peak_resident_mb())
      .add("comm_ms", r.comm.comm_ms).add("exposed_comm_ms", r.comm.exposed_ms).add("comm_bytes", r.comm.bytes)
      .add("mem_params_mb", mb(mem.params)).add("mem_grads_mb", mb(mem.grads))
      .add("mem_optimizer_mb", mb(mem.optimizer)).add("data_wait_ms", data_wait_ms);
  if (t_.parallel.step.fp16) line.add("loss_scale", r.loss_scale).add("skipped", static_cast<int64_t>(r.skipped));
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
  const int64_t eval_every = t_.training.eval_every;
  if (w_.val && ((eval_every > 0 && done % eval_every == 0) || done == steps_)) {
    if (tracing) tracer_->push("evaluate");
    begin_memory_phase();
    const parallel::EvalResult e = pm_->evaluate(*w_.val, t_.training.eval_steps * micro_batch_, w_.eval_batch);
    peaks_.eval = phase_peak_resident_mb();
    if (tracing) tracer_->pop();
    last_eval_ = e;  // every rank's
    if (lead_) {
      line.add("val_loss", e.loss);
      if (e.accuracy >= 0) line.add("val_accuracy", e.accuracy);
      progress_->note(cat("step ", done, ": val_loss ", e.loss, e.accuracy >= 0 ? cat(", val_accuracy ", e.accuracy) : std::string()));
    }
  }
  saved(saver_->poll());
  const std::array<bool, 3> flags = agree(done, busy_ms, line);
  const int64_t every = t_.checkpoint.every;
  const bool stop = flags[0] && done < steps_;
  // The step's line goes out before its checkpoint: a checkpoint never outlives the metrics
  // of the steps it holds (a crash in between loses neither). The save's stall is therefore
  // reported on the next step's line.
  if (ckpt_stall_ms_ >= 0) line.add("ckpt_stall_ms", ckpt_stall_ms_);
  ckpt_stall_ms_ = -1;
  if (job_.restarted && done == start_step_ + 1) {
    const double since_s = static_cast<double>(launch::unix_ms() - job_.elastic->since_unix_ms) / 1e3;
    line.add("elastic_restart_s", since_s);
    log_info(cat("elastic generation ", job_.elastic->generation, ": first step done ", since_s,
                 " s after the previous generation ended"));
  }
  if (metrics_) metrics_->write(line);
  if (exporter_) exporter_->observe(line.str());
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
    exit_code_ = launch::kExitForResize;
  }
  if (stop) {
    saved(saver_->wait());
    if (!terminate_seen_) terminate_seen_ = std::chrono::steady_clock::now();  // another rank's signal
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - *terminate_seen_).count();
    log_info(cat("SIGTERM: saved step ", done, " of ", steps_, " (", last_checkpoint_, ") ", took,
                 " s after the signal; stopping. `loom train ... --resume` continues from it"));
    stopped_on_sigterm_ = true;
    exit_code_ = t_.checkpoint.sigterm_exit_code;
    if (took > t_.checkpoint.grace_s)
      log_warn(cat("the save after SIGTERM took ", took, " s, over checkpoint.grace_s = ", t_.checkpoint.grace_s,
                   " s: the job may be killed before it ends next time"));
    end_step_ = done;
  }
  if (tracing) {
    tracer_->pop();  // the step
    pm_->set_tracer(nullptr);
    if (done == t_.profile.steps.back() || end_step_ == done) {
      const std::string path = (fs::path(t_.job.run) / "trace.json").string();
      parallel::write_merged_trace(*world_, *trace_, path);
      progress_->note(cat("trace of step(s) ", t_.profile.trace_steps, " of ", world_->size(), " rank(s): ", path));
    }
  }
}

int TrainRun::finish() {
  if (ps_) return finish_ps();
  saved(saver_->wait());  // the last save complete before the run reports done
  progress_->finish();
  if (end_step_ == steps_ && w_.val && last_eval_.items > 0 && last_eval_.accuracy >= 0) {
    // A full pass over the test set for the final figure (a classifier). Collective.
    const parallel::EvalResult full = pm_->evaluate(*w_.val, 0, w_.eval_batch);
    if (lead_)
      std::printf("test accuracy %.4f over %lld images (loss %.4f)\n", full.accuracy, static_cast<long long>(full.items),
                  full.loss);
  }
  if (lead_) print_summary();
  // On standard output, --quiet or not: what a batch script decides on (requeue or not).
  if (lead_ && stopped_on_sigterm_)
    std::printf("stopped on SIGTERM after step %lld of %lld, saved in %s: --resume continues\n", static_cast<long long>(end_step_),
                static_cast<long long>(steps_), printable(last_checkpoint_).c_str());
  if (lead_) std::printf("run directory: %s\n", printable(t_.job.run).c_str());
  write_end_event();
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
                t_.parallel.pp_schedule.c_str(), static_cast<long long>(t_.parallel.step.accum), tokens_per_step_ * n / step_s_total_,
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

}  // namespace loom::train
