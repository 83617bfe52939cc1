// `loom train` with parameter servers ([parallel] ps_servers = S, docs/parallelism.md
// "Parameter servers"): ranks 0..S-1 serve key ranges of the model, the others are workers
// whose step is parallel::parallelize_ps_worker's. Rank 0, the first server, keeps the
// run's books: metrics per step, evaluations and (with the other servers, each writing its
// range) checkpoints. Workers may join a running async or ssp job (--ps-join).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/core/log.h"
#include "loom/launch/rank_group.h"
#include "train_run.h"
#include "loom/train/debug_hooks.h"

namespace loom::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Each rank of a traced run writes its events here; the first server merges them into trace.json.
std::string trace_part(const std::string& run, int rank) {
  return (fs::path(run) / "logs" / cat("trace-rank", rank, ".json")).string();
}

}  // namespace

std::string TrainRun::role() const {
  if (job_.ps_join_world > 0) return cat("joined worker rank ", rank());
  return cat("rank ", rank(), " (", ps_->server() ? cat("parameter server ", rank()) : cat("worker ", ps_->worker()), ")");
}

// Joins the job (or, with --ps-join, the running job at its store), links this rank to the
// other end, and builds its role: a server's ParamServer with the resumed optimizer state,
// or a worker's step, its parameters pulled from the servers.
void TrainRun::join_ps() {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(t_.comm.timeout_s * 1000));
  const parallel::PsJobConfig cfg{.servers = t_.parallel.ps.servers,
                                  .mode = parallel::ps_mode_named(t_.parallel.ps.mode),
                                  .hierarchical = t_.parallel.ps.hierarchical};
  if (job_.ps_join_world > 0) {
    store_ = std::move(job_.join_store);
    ps_.emplace(parallel::PsJob::join_running(
        *store_, job_.ps_join_world, cfg,
        {.transport = t_.comm.transport, .timeout = timeout, .job_id = env_.job_id, .secret = env_.secret}));
    log_info(cat("joined the parameter-server job at ", a_.ps_join, " as worker rank ", ps_->rank(), " (data shard of worker ",
                 ps_->worker(), ")"));
  } else {
    world_ = comm::join_world(env_, {.transport = t_.comm.transport, .timeout = timeout}, server_, store_);
    check_same_layout(*world_, t_.layout);
    if (!t_.profile.steps.empty()) {
      comm::barrier(*world_);  // every rank's origin: the barrier's exit
      trace_.emplace(obs::Trace::Clock::now());
      tracer_.emplace(*trace_);
    }
    ps_.emplace(parallel::PsJob::join(*world_, *store_, cfg, t_.layout));
    // Async and ssp go on without a worker that dies: its launcher is told not to stop the job.
    if (!ps_->server() && cfg.mode != parallel::PsMode::kSync)
      store_->set(launch::expendable_key(env_.rank), "1", comm::Clock::now() + world_->config().timeout);
  }
  ParamSet& params = w_.model->params();
  if (ps_->server()) {
    const std::vector<int64_t> bounds = ps_->bounds(params.numel());
    const int s = ps_->rank();
    ps_server_ = std::make_unique<parallel::ParamServer>(
        ps_->links(), ps_->servers_group(), params, bounds[s], bounds[s + 1], t_.parallel.step.optimizer,
        parallel::PsServerConfig{.mode = cfg.mode, .staleness = t_.parallel.ps.staleness,
                                 .deterministic = t_.parallel.deterministic, .workers = ps_->workers(),
                                 .start_step = start_step_, .steps = steps_, .schedule = t_.schedule,
                                 .max_norm = t_.parallel.step.grad_clip});
    if (ck_) {
      optim::RangeState st = ps_server_->optimizer_state();
      ck_->load_optimizer(params, st);
      ps_server_->set_optimizer_steps(st.steps);
      check_finite();
      log_info(cat("resuming from ", ck_->path(), " at step ", start_step_));
      last_checkpoint_ = ck_->path();
      ck_.reset();
    }
    return;
  }
  pm_ = parallel::parallelize_ps_worker(*w_.model, *ps_, t_.parallel.step);
  if (w_.teacher)
    pm_->set_loss_targets([this](const Tensor& tokens, nn::CrossEntropyCtx& loss) {
      loss.distill = w_.teacher->targets(tokens, {}, loss.distill.soft);
    });
  try {
    pm_->sync_params();  // the servers' parameters, and the steps they have done
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat(role(), ": ", e.what()));
  }
  start_step_ = *pm_->steps_done();
}

void TrainRun::log_ps_start() {
  const int links = static_cast<int>(ps_->leaders().size());
  log_info(cat("training ", model_name(), " (", w_.model->params().numel(), " parameters) on ", t_.data.train, ": ",
               steps_, " steps of ", global_batch_, " x ", w_.train->tokens_per_example(), " tokens, ", ps_->servers(),
               " parameter server(s) and ", ps_->workers(), " worker(s), ", t_.parallel.ps.mode,
               ps_->mode() == parallel::PsMode::kSsp ? cat(" (staleness ", t_.parallel.ps.staleness, ")") : std::string(),
               t_.parallel.deterministic ? ", deterministic" : "",
               links < ps_->workers() ? cat(", the workers of each host summing first (", links, " link(s) per server)")
                                      : std::string(),
               "; run directory ", t_.job.run));
}

// A worker's step: its micro-batches (its data shard of the global batch), pushed and the
// parameters pulled (parallel::parallelize_ps_worker). The metrics are the first server's.
void TrainRun::ps_step(int64_t step) {
  try {
    const int64_t done = step + 1;
    if (const int64_t ms = delay_ms_ + step_jitter_ms(t_.debug.jitter_ms, rank(), step); ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const bool tracing = trace_ && std::binary_search(t_.profile.steps.begin(), t_.profile.steps.end(), done);
    if (tracing) {
      tracer_->push(cat("step ", done));
      pm_->set_tracer(&*tracer_);
    }
    const int w = pm_->replica();
    pm_->step(done, [&](int64_t m) {
      std::vector<int64_t> items(static_cast<size_t>(micro_batch_));
      for (int64_t i = 0; i < micro_batch_; ++i)
        items[i] = sampler_->item(step * global_batch_ + w * per_rank_ + m * micro_batch_ + i);
      return w_.train->batch(items);
    }, optim::lr_at(t_.schedule, step));
    if (tracing) {
      tracer_->pop();
      pm_->set_tracer(nullptr);
    }
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat(role(), ": ", e.what()));
  }
}

// A worker's end: the servers keep the books; its part of a trace for the first server to merge.
int TrainRun::finish_ps() {
  if (trace_) write_file_atomic(trace_part(t_.job.run, rank()), trace_->events(rank()));
  return 0;
}

// A server's rank: serves its range until every worker is done. The first server writes a
// metrics line for every step, evaluates (sync: every training.eval_every steps) and saves
// with the others (sync: every checkpoint.every steps); async and ssp steps do not come in
// the same order on every server, so those evaluate and save once the servers stop.
int TrainRun::serve() {
  try {
    parallel::ParamServer& server = *ps_server_;
    comm::Communicator& group = ps_->servers_group();
    const int s = group.rank();
    ParamSet& params = w_.model->params();
    const std::vector<int64_t> bounds = ps_->bounds(params.numel());
    auto save = [&](int64_t step) {
      return parallel::save_checkpoint(group, parallel::ps_server_share(params, server, bounds[s], bounds[s + 1]),
                                       t_.checkpoint.root, step, checkpoint_state(step), layout_,
                                       save_options(true));
    };
    const bool sync = ps_->mode() == parallel::PsMode::kSync;
    auto last = Clock::now();
    double push_total = 0, pull_total = 0;
    int64_t timed = 0, max_staleness = 0;
    server.on_step([&](const parallel::PsStep& st) {
      const auto now = Clock::now();
      if (trace_ && std::binary_search(t_.profile.steps.begin(), t_.profile.steps.end(), st.step))
        trace_->span(obs::Trace::kTraining, cat("step ", st.step, " (", st.pushes, " pushes)"), last, now,
                     {{"max_staleness", cat(st.max_staleness)}, {"max_queue", cat(st.max_queue)}});
      const double step_s = std::chrono::duration<double>(now - last).count();
      last = now;
      ema_step_s_ = timed == 0 ? step_s : 0.9 * ema_step_s_ + 0.1 * step_s;
      if (st.step > start_step_ + 1) {  // the first step waits for every worker to start
        step_s_total_ += step_s;
        push_total += st.push_ms;
        pull_total += st.pull_ms;
        ++timed;
      }
      max_staleness = std::max(max_staleness, st.max_staleness);
      obs::JsonLine line;
      line.add("step", st.step).add("loss", st.loss).add("lr", st.lr).add("grad_norm", st.grad_norm)
          .add("tokens", static_cast<int64_t>(tokens_per_step_)).add("step_ms", step_s * 1e3)
          .add("tokens_per_s", tokens_per_step_ / step_s).add("mem_peak_mb", peak_resident_mb())
          .add("ps_pushes", st.pushes).add("ps_push_ms", st.push_ms).add("ps_pull_ms", st.pull_ms)
          .add("ps_staleness_max", st.max_staleness).add("ps_staleness_mean", st.mean_staleness)
          .add("ps_queue_max", st.max_queue).add("ps_held_ms", st.held_ms).add("ps_bytes", st.bytes)
          .add("ps_local_bytes", st.local_bytes);
      std::string per_worker;
      for (size_t w = 0; w < st.staleness.size(); ++w) per_worker += cat(w == 0 ? "" : ",", st.staleness[w]);
      line.add_string("ps_staleness", per_worker);
      const int64_t every = t_.checkpoint.every, eval_every = t_.training.eval_every;
      if (sync && w_.val && eval_every > 0 && st.step % eval_every == 0 && st.step < steps_) {
        parallel::gather_ps_ranges(group, params, bounds);
        if (lead_)
          line.add("val_loss",
                   parallel::evaluate(*w_.model, *w_.val, t_.training.eval_steps * micro_batch_, w_.eval_batch).loss);
      }
      if (metrics_) metrics_->write(line);
      if (exporter_) exporter_->observe(line.str());
      progress_->update(st.step, st.loss, tokens_per_step_ / step_s, ema_step_s_);
      if (sync && every > 0 && st.step % every == 0 && st.step < steps_) {
        last_checkpoint_ = save(st.step);
        progress_->note(cat("checkpoint ", last_checkpoint_));
      }
    });
    server.on_drop([&](int rank, const std::string& why) {
      log_warn(cat("parameter server ", s, ": dropped worker rank ", rank, ": ", why, "; training goes on with the others"));
    });
    {
      // Async and ssp: workers may join the running job (loom train --ps-join).
      std::optional<parallel::PsJoinPoller> joins;
      if (!sync) joins.emplace(*ps_, server);
      server.serve();
    }
    progress_->finish();
    if (trace_) write_file_atomic(trace_part(t_.job.run, s), trace_->events(s));
    // The run's end: the final model on the first server, evaluated and saved. Async and ssp
    // servers may end a push apart (a worker lost between its pushes to two of them): the
    // checkpoint takes the first server's count of steps.
    parallel::gather_ps_ranges(group, params, bounds);
    int64_t done = server.steps_done();
    comm::broadcast(group, {.buffer = &done, .count = 1, .dtype = DType::kI64});
    last_checkpoint_ = save(done);
    if (!lead_) return 0;
    if (w_.val) {
      parallel::EvalResult e = parallel::evaluate(*w_.model, *w_.val, t_.training.eval_steps * micro_batch_, w_.eval_batch);
      if (e.accuracy >= 0) e = parallel::evaluate(*w_.model, *w_.val, 0, w_.eval_batch);  // a classifier's final figure: the whole test set
      obs::JsonLine line;
      line.add("step", done).add("final_val_loss", e.loss);
      if (e.accuracy >= 0) line.add("final_val_accuracy", e.accuracy);
      metrics_->write(line);
      std::printf("validation loss %.4f%s after %lld steps\n", e.loss,
                  e.accuracy >= 0 ? cat(", accuracy ", e.accuracy).c_str() : "", static_cast<long long>(done));
    }
    if (timed > 0)
      std::printf("parameter servers: %d server(s), %d worker(s), %s%s: %.0f tokens/s, step %.1f ms, push %.1f ms, pull "
                  "%.1f ms (mean per worker), staleness at most %lld\n",
                  ps_->servers(), ps_->workers(), t_.parallel.ps.mode.c_str(),
                  ps_->mode() == parallel::PsMode::kSsp ? cat(" (K = ", t_.parallel.ps.staleness, ")").c_str() : "",
                  tokens_per_step_ * static_cast<double>(timed) / step_s_total_,
                  step_s_total_ * 1e3 / static_cast<double>(timed), push_total / static_cast<double>(timed),
                  pull_total / static_cast<double>(timed), static_cast<long long>(max_staleness));
    if (trace_) {
      // Every rank's part that exists (a worker lost on the way wrote none).
      std::vector<std::string> parts;
      for (int r = 0; r < world_->size(); ++r)
        if (path_exists(trace_part(t_.job.run, r))) parts.push_back(read_file(trace_part(t_.job.run, r)));
      const std::string path = (fs::path(t_.job.run) / "trace.json").string();
      write_file_atomic(path, obs::merge_traces(parts));
      std::printf("trace of step(s) %s of %zu rank(s): %s\n", printable(t_.profile.trace_steps).c_str(), parts.size(),
                  printable(path).c_str());
    }
    std::printf("checkpoint: %s\nrun directory: %s\n", printable(last_checkpoint_).c_str(), printable(t_.job.run).c_str());
    return 0;
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat(role(), ": ", e.what()));
  }
}

}  // namespace loom::train
