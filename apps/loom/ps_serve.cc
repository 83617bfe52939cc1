// `loom train` with parameter servers ([parallel] ps_servers = S, docs/parallelism.md
// "Parameter servers"): ranks 0..S-1 serve key ranges of the model, the others train.
// Rank 0, the first server, writes the run directory: metrics per step, evaluations and
// (with the other servers, each writing its range) checkpoints.
#include "ps_job.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "loom/parallel/checkpointing.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/data/data.h"
#include "loom/parallel/data_parallel.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/core/log.h"
#include "loom/obs/metrics.h"
#include "loom/parallel/param_server.h"
#include "loom/parallel/parallelize.h"
#include "loom/comm/rendezvous.h"
#include "loom/core/threads.h"
#include "loom/obs/trace.h"
#include "loom/launch/launch.h"
#include "loom/launch/rank_group.h"
#include "loom/checkpoint/run_dir.h"
#include "job_start.h"
#include "loom/parallel/mesh.h"
#include "workload.h"
#include "train_watch.h"

namespace loom::app::ps {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Every server's range into the first server's params.values(). Collective over the servers.
void gather_ranges(comm::Communicator& group, ParamSet& params, const std::vector<int64_t>& bounds) {
  float* v = params.values().data<float>();
  const int me = group.rank();
  for (int s = 1; s < group.size(); ++s) {
    const auto count = static_cast<size_t>(bounds[s + 1] - bounds[s]);
    if (me == s) comm::send(group, {.buffer = v + bounds[s], .count = count, .peer = 0});
    if (me == 0) comm::recv(group, {.buffer = v + bounds[s], .count = count, .peer = s});
  }
}

// A server's share of a checkpoint: its range of the parameters and its optimizer state.
parallel::RankShare server_share(const ParamSet& params, const parallel::ParamServer& server, int64_t begin,
                                 int64_t end) {
  parallel::RankShare share;
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

}  // namespace

int serve(const Job& job, const TrainArgs& a, bool resume, Workload& task, comm::Communicator& world,
          comm::Communicator& group, std::vector<comm::Communicator*> links) {
  const TrainConfig& t = job.t;
  const int s = world.rank();
  const bool lead = s == 0;
  ParamSet& params = task.model->params();
  const std::vector<int64_t> bounds = parallel::ps_key_ranges(params.numel(), job.servers);
  std::optional<checkpoint::Checkpoint> ck;
  int64_t start_step = 0;
  if (resume) {
    ck.emplace(parallel::open_for_resume(job.ckpt_root, task.model_json(), job.seed, job.steps, job.global_batch));
    ck->load_params(params);
    start_step = ck->state().step;
    if (lead) parallel::set_aside_uncommitted_steps(job.ckpt_root);  // `latest` has proven good
  }
  parallel::ParamServer server(
      links, group, params, bounds[s], bounds[s + 1], t.parallel.step.optimizer,
      {.mode = job.mode, .staleness = t.parallel.ps.staleness, .deterministic = t.parallel.deterministic,
       .workers = job.workers, .start_step = start_step, .steps = job.steps,
       .schedule = t.schedule,
       .max_norm = t.parallel.step.grad_clip});
  if (ck) {
    optim::RangeState st = server.optimizer_state();
    ck->load_optimizer(params, st);
    server.set_optimizer_steps(st.steps);
    if (const std::string bad = ck->nonfinite_report(); !bad.empty() && !a.allow_nonfinite)
      throw InputError(cat(bad, "; training from it would spread them: resume from an earlier checkpoint, or pass "
                                "--allow-nonfinite"));
    log_info(cat("resuming from ", ck->path(), " at step ", start_step));
    ck.reset();
  }

  const std::string metrics_path = (fs::path(job.run) / "metrics.jsonl").string();
  std::optional<obs::MetricsFile> metrics;
  if (lead) {
    fs::create_directories(fs::path(job.run) / "logs");
    write_file_atomic((fs::path(job.run) / "config.toml").string(), t.toml);
    if (resume) checkpoint::truncate_metrics(metrics_path, start_step);
    metrics.emplace(metrics_path);
  }
  const json layout = {{"world", world.size()}, {"ps_servers", job.servers}, {"ps_workers", job.workers},
                       {"ps_mode", t.parallel.ps.mode}, {"dp", job.workers}, {"tp", 1}, {"pp", 1}, {"zero", 0}};
  auto save = [&](int64_t step) {
    json rng = {{"generator", "xoshiro256** (splitmix64-seeded)"}, {"seed", job.seed},
                {"streams", {{"init", 1}, {"data_epoch_e", "1000 + e"}}},
                {"data_epoch", step * job.global_batch / task.train->size()}};
    json state = {{"data_cursor", step * job.global_batch}, {"rng", rng}, {"model", task.model_json()},
                  {"config", t.toml}};
    return parallel::save_checkpoint(group, server_share(params, server, bounds[s], bounds[s + 1]), job.ckpt_root, step,
                                     state, layout, {.keep = t.checkpoint.keep});
  };
  const bool sync = job.mode == parallel::PsMode::kSync;
  const double tokens_per_step = static_cast<double>(job.global_batch * task.train->tokens_per_example());
  obs::Progress progress(job.steps, t.job.log_every, a.quiet || !lead);
  auto last = Clock::now();
  double ema_step_s = 0, step_s_total = 0, push_total = 0, pull_total = 0;
  int64_t timed = 0, max_staleness = 0;
  std::string last_checkpoint;
  // [profile] trace_steps: each traced step's window on this server, from the last step's end.
  std::optional<obs::Trace> server_trace;
  if (!job.trace_steps.empty() && job.trace_origin) server_trace.emplace(*job.trace_origin);
  server.on_step([&](const parallel::PsStep& st) {
    const auto now = Clock::now();
    if (server_trace && std::binary_search(job.trace_steps.begin(), job.trace_steps.end(), st.step))
      server_trace->span(obs::Trace::kTraining, cat("step ", st.step, " (", st.pushes, " pushes)"), last, now,
                         {{"max_staleness", cat(st.max_staleness)}, {"max_queue", cat(st.max_queue)}});
    const double step_s = std::chrono::duration<double>(now - last).count();
    last = now;
    ema_step_s = timed == 0 ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
    if (st.step > start_step + 1) {  // the first step waits for every worker to start
      step_s_total += step_s;
      push_total += st.push_ms;
      pull_total += st.pull_ms;
      ++timed;
    }
    max_staleness = std::max(max_staleness, st.max_staleness);
    obs::JsonLine line;
    line.add("step", st.step).add("loss", st.loss).add("lr", st.lr).add("grad_norm", st.grad_norm)
        .add("tokens", static_cast<int64_t>(tokens_per_step)).add("step_ms", step_s * 1e3)
        .add("tokens_per_s", tokens_per_step / step_s).add("mem_peak_mb", peak_resident_mb())
        .add("ps_pushes", st.pushes).add("ps_push_ms", st.push_ms).add("ps_pull_ms", st.pull_ms)
        .add("ps_staleness_max", st.max_staleness).add("ps_staleness_mean", st.mean_staleness)
        .add("ps_queue_max", st.max_queue).add("ps_held_ms", st.held_ms).add("ps_bytes", st.bytes)
        .add("ps_local_bytes", st.local_bytes);
    std::string per_worker;
    for (size_t w = 0; w < st.staleness.size(); ++w) per_worker += cat(w == 0 ? "" : ",", st.staleness[w]);
    line.add_string("ps_staleness", per_worker);
    // Sync steps come in the same order on every server: evaluations and checkpoints are
    // collective over them. Async and ssp ones do not, so those run once the servers stop.
    const int64_t every = t.checkpoint.every, eval_every = t.training.eval_every;
    if (sync && task.val && eval_every > 0 && st.step % eval_every == 0 && st.step < job.steps) {
      gather_ranges(group, params, bounds);
      if (lead) line.add("val_loss", parallel::evaluate(*task.model, *task.val, t.training.eval_steps * job.micro_batch, task.eval_batch).loss);
    }
    if (metrics) metrics->write(line);
    progress.update(st.step, st.loss, tokens_per_step / step_s, ema_step_s);
    if (sync && every > 0 && st.step % every == 0 && st.step < job.steps) {
      last_checkpoint = save(st.step);
      progress.note(cat("checkpoint ", last_checkpoint));
    }
  });
  server.on_drop([&](int rank, const std::string& why) {
    log_warn(cat("parameter server ", s, ": dropped worker rank ", rank, ": ", why, "; training goes on with the others"));
  });
  // Async and ssp: workers may join the running job (loom train --ps-join), announcing
  // themselves in the store; this server links to each and serves it from then on.
  std::vector<std::unique_ptr<comm::Communicator>> joined;
  std::atomic<bool> serving{true};
  std::thread poller;
  if (!sync)
    poller = std::thread([&] {
      int64_t seen = 0;
      while (serving) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        int64_t count = 0;
        try {
          const auto v = job.store->try_get(kJoins, comm::Clock::now() + std::chrono::seconds(1));
          count = v ? std::stoll(*v) : 0;
        } catch (const Error&) {
          continue;
        }
        for (; seen < count && serving; ++seen) {
          comm::CommConfig cfg = world.config();
          const int rank = world.size() + static_cast<int>(seen);
          cfg.job_ranks = {s, rank};
          try {
            auto link = comm::Communicator::create(*job.store, 0, 2, cfg, cat("ps/", s, "/j", seen));
            const int l = server.add_link(link.get());
            if (l < 0) continue;  // the run is over: the joiner's link closes
            log_info(cat("parameter server ", s, ": worker rank ", rank, " joined the job (link ", l, ")"));
            joined.push_back(std::move(link));
          } catch (const Error& e) {
            log_warn(cat("parameter server ", s, ": worker rank ", rank, " asked to join but did not connect: ", e.what()));
          }
        }
      }
    });
  try {
    server.serve();
  } catch (...) {
    serving = false;
    if (poller.joinable()) poller.join();
    throw;
  }
  serving = false;
  if (poller.joinable()) poller.join();
  progress.finish();
  if (server_trace) write_file_atomic(trace_part(job, world.rank()), server_trace->events(world.rank()));
  // The run's end: the final model on the first server, evaluated and saved.
  gather_ranges(group, params, bounds);
  // Async and ssp servers may end a push apart (a worker lost between its pushes to two of
  // them): the checkpoint takes the first server's count of steps.
  int64_t done = server.steps_done();
  comm::broadcast(group, {.buffer = &done, .count = 1, .dtype = DType::kI64});
  last_checkpoint = save(done);
  if (lead) {
    if (task.val) {
      parallel::EvalResult e = parallel::evaluate(*task.model, *task.val, t.training.eval_steps * job.micro_batch, task.eval_batch);
      if (e.accuracy >= 0) e = parallel::evaluate(*task.model, *task.val, 0, task.eval_batch);  // a classifier's final figure: the whole test set
      obs::JsonLine line;
      line.add("step", done).add("final_val_loss", e.loss);
      if (e.accuracy >= 0) line.add("final_val_accuracy", e.accuracy);
      metrics->write(line);
      std::printf("validation loss %.4f%s after %lld steps\n", e.loss,
                  e.accuracy >= 0 ? cat(", accuracy ", e.accuracy).c_str() : "", static_cast<long long>(done));
    }
    if (timed > 0)
      std::printf("parameter servers: %d server(s), %d worker(s), %s%s: %.0f tokens/s, step %.1f ms, push %.1f ms, pull "
                  "%.1f ms (mean per worker), staleness at most %lld\n",
                  job.servers, job.workers, t.parallel.ps.mode.c_str(),
                  job.mode == parallel::PsMode::kSsp ? cat(" (K = ", t.parallel.ps.staleness, ")").c_str() : "",
                  tokens_per_step * static_cast<double>(timed) / step_s_total, step_s_total * 1e3 / static_cast<double>(timed),
                  push_total / static_cast<double>(timed), pull_total / static_cast<double>(timed),
                  static_cast<long long>(max_staleness));
    if (server_trace) {
      // Every rank's part that exists (a worker lost on the way wrote none).
      std::vector<std::string> parts;
      for (int r = 0; r < world.size(); ++r)
        if (path_exists(trace_part(job, r))) parts.push_back(read_file(trace_part(job, r)));
      const std::string path = (fs::path(job.run) / "trace.json").string();
      write_file_atomic(path, obs::merge_traces(parts));
      std::printf("trace of step(s) %s of %zu rank(s): %s\n", printable(t.profile.trace_steps).c_str(), parts.size(),
                  printable(path).c_str());
    }
    std::printf("checkpoint: %s\nrun directory: %s\n", printable(last_checkpoint).c_str(), printable(job.run).c_str());
  }
  return 0;
}

}  // namespace loom::app::ps
