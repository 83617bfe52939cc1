// `loom train` with parameter servers ([parallel] ps_servers = S, docs/parallelism.md
// "Parameter servers"): ranks 0..S-1 serve key ranges of the model, the others train.
// Rank 0, the first server, writes the run directory: metrics per step, evaluations and
// (with the other servers, each writing its range) checkpoints.
#include "ps_train.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "loom/checkpointing.h"
#include "loom/checkpoint.h"
#include "loom/data.h"
#include "loom/data_parallel.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "loom/host.h"
#include "loom/log.h"
#include "loom/metrics.h"
#include "loom/param_server.h"
#include "loom/parallelize.h"
#include "loom/rendezvous.h"
#include "loom/threads.h"
#include "loom/trace.h"
#include "launch.h"
#include "rank_group.h"
#include "run_dir.h"
#include "job_start.h"
#include "loom/mesh.h"
#include "workload.h"
#include "train_watch.h"

namespace loom::app {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

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
std::string trace_part(const Job& job, int rank) {
  return (fs::path(job.run) / "logs" / cat("trace-rank", rank, ".json")).string();
}

// The store keys of workers that join a running job: "ps/joins" counts them, and joined
// worker k links to server s as "ps/<s>/j<k>"; "ps/layout" holds the world size and the
// layout every rank shares, for them to check theirs against.
constexpr const char* kJoins = "ps/joins";
constexpr const char* kLayout = "ps/layout";

// The pair communicators of this rank's links: a server's to every leader, a leader's to
// every server, each created in ascending order of the other end (no cycle of waits).
std::vector<std::unique_ptr<comm::Communicator>> make_links(const Job& job, comm::Communicator& world, comm::Store& store) {
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

std::vector<comm::Communicator*> raw(const std::vector<std::unique_ptr<comm::Communicator>>& links) {
  std::vector<comm::Communicator*> out;
  for (const auto& l : links) out.push_back(l.get());
  return out;
}

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
    if (resume) truncate_metrics(metrics_path, start_step);
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

// Worker w (its data shard; `rank`: its job rank, for the test hooks).
int work(const Job& job, Workload& task, int w, int rank, comm::Communicator& local, std::vector<comm::Communicator*> links) {
  const TrainConfig& t = job.t;
  ParamSet& params = task.model->params();
  // The gradient sums over this worker's micro-batches and, with a host reduce, over its
  // host's workers (an all-reduce over shared memory, overlapped with backward); exact
  // limbs in deterministic mode.
  parallel::DataParallel dp(local, params, t.parallel.step.optimizer,
                            {.bucket_mb = t.parallel.step.dp.bucket_mb, .deterministic = t.parallel.deterministic},
                            task.model->block_offsets());
  task.model->hooks().add([&](int block, BlockPhase phase) { dp.on_block(block, phase); });
  // One micro-batch's forward and backward; the loss mixes in the teacher's targets when
  // distilling.
  std::unique_ptr<nn::ModelCtx> ctx = task.model->make_ctx();
  auto micro_step = [&](const std::vector<int64_t>& items, double scale) {
    const data::Batch b = task.train->batch(items);
    if (task.teacher) {
      nn::CrossEntropyCtx& loss = task.model->loss_ctx(*ctx);
      loss.distill = task.teacher->targets(b.inputs, {}, loss.distill.soft);
    }
    const double l = task.model->forward(b.inputs, b.targets, *ctx);
    task.model->backward(*ctx, scale);
    return l;
  };
  const bool leader = !links.empty();
  std::optional<parallel::PsWorker> worker;
  if (leader) worker.emplace(links, params, parallel::ps_key_ranges(params.numel(), job.servers), job.mode);
  const bool sync = job.mode == parallel::PsMode::kSync;
  // Sync: the workers' gradients add up to the global batch's mean. Async and ssp: each push
  // is its own update, the mean over this worker's items.
  const double scale = 1.0 / static_cast<double>(job.accum * (sync ? job.workers : 1));
  data::Sampler sampler(task.train->size(), job.seed);
  const int64_t delay_ms = step_delay_ms(job.t.debug.delay_ms, rank);
  // [profile] trace_steps: this worker's compute, pushes and pulls (the communication track).
  std::optional<obs::Trace> trace;
  if (!job.trace_steps.empty() && job.trace_origin) trace.emplace(*job.trace_origin);
  // The leader's exchange, and the parameters it pulled, to the rest of its host's workers.
  auto share = [&](parallel::PsReply r) {
    if (local.size() == 1) return r;
    double fields[2] = {static_cast<double>(r.step), r.stop ? 1.0 : 0.0};
    comm::broadcast(local, {.buffer = fields, .count = 2, .dtype = DType::kF64});
    comm::broadcast(local, {.buffer = params.values().raw(), .count = static_cast<size_t>(params.numel())});
    return parallel::PsReply{.step = static_cast<int64_t>(fields[0]), .stop = fields[1] != 0};
  };
  parallel::PsReply reply = share(leader ? worker->hello(job.accum * local.size()) : parallel::PsReply{});
  for (int64_t step = reply.step; !reply.stop; ++step) {
    const bool tracing = trace && std::binary_search(job.trace_steps.begin(), job.trace_steps.end(), step + 1);
    const auto step_begin = Clock::now();
    if (const int64_t ms = delay_ms + step_jitter_ms(job.t.debug.jitter_ms, rank, step); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    dp.begin_step();
    std::vector<double> losses;
    for (int64_t m = 0; m < job.accum; ++m) {
      const auto micro_begin = Clock::now();
      dp.begin_micro_step(m == job.accum - 1);
      std::vector<int64_t> items(static_cast<size_t>(job.micro_batch));
      for (int64_t i = 0; i < job.micro_batch; ++i)
        items[i] = sampler.item(step * job.global_batch + w * job.per_worker + m * job.micro_batch + i);
      losses.push_back(micro_step(items, scale));
      dp.end_micro_step();
      if (tracing) trace->span(obs::Trace::kTraining, cat("micro-step ", m), micro_begin, Clock::now());
    }
    const parallel::DataParallel::Gradients g = dp.finish_gradients();
    const int64_t local_bytes = local.size() > 1 ? dp.take_stats().bytes : 0;  // one rank's "all-reduce" moves nothing
    if (local.size() > 1) {  // the host's losses in worker order, as the servers sum them
      std::vector<double> all(losses.size() * static_cast<size_t>(local.size()));
      comm::all_gather(local, {.input = losses.data(), .output = all.data(), .count = losses.size(), .dtype = DType::kF64});
      losses = std::move(all);
    }
    const double norm = sync ? 0 : optim::clip_grad_norm(params, t.parallel.step.grad_clip);
    if (!sync && !std::isfinite(norm))
      throw RuntimeError(cat("step ", step + 1, ": this worker's gradient norm is not finite (", norm,
                             "); it stops without pushing (a lower training.lr or a training.grad_clip may help)"));
    const auto exchange = Clock::now();
    reply = share(leader ? worker->push_pull({.step = step, .grads = g.sums, .losses = losses, .grad_norm = norm,
                                              .unsummable = g.unsummable, .local_bytes = local_bytes})
                         : parallel::PsReply{});
    if (tracing) {
      const auto ms = [](double x) {
        return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(x));
      };
      const auto pushed = exchange + ms(reply.push_ms);
      if (leader) {
        trace->span(obs::Trace::kComm, "push gradients", exchange, pushed, {{"staleness", cat(reply.staleness)}});
        trace->span(obs::Trace::kComm, "pull parameters", pushed, pushed + ms(reply.pull_ms),
                    {{"held_ms", cat(reply.held_ms)}});
      } else {
        trace->span(obs::Trace::kComm, "parameters from the host's leader", exchange, Clock::now());
      }
      trace->span(obs::Trace::kTraining, cat("step ", step + 1), step_begin, Clock::now());
    }
  }
  if (trace) write_file_atomic(trace_part(job, rank), trace->events(rank));
  if (leader) worker->goodbye();
  return 0;
}

// The job's sizes from a config resolved for `world` ranks.
Job make_job(const TrainConfig& t, int world) {
  Job job{.t = t};
  job.servers = t.parallel.ps.servers;
  job.workers = world - job.servers;
  job.mode = parallel::ps_mode_named(t.parallel.ps.mode);
  job.steps = t.training.steps;
  job.global_batch = t.training.global_batch;
  job.micro_batch = t.training.micro_batch;
  job.per_worker = job.global_batch / job.workers;
  job.accum = job.per_worker / job.micro_batch;
  job.seed = t.job.seed;
  job.run = t.job.run;
  job.ckpt_root = t.checkpoint.root;
  return job;
}

}  // namespace

int run_ps_train(const TrainConfig& t, const TrainArgs& a, const comm::LaunchEnv& env, bool restarted) {
  Job job = make_job(t, env.size);
  if (a.resume && a.restart) throw InputError("--resume and --restart: expected one of them");
  if (!a.init_from.empty())
    throw InputError("--init-from with parallel.ps_servers > 0: the servers start from the config's initialization or "
                     "--resume; expected no --init-from");
  const bool resume = a.resume || (restarted && checkpoint::latest_step_dir(job.ckpt_root));
  const bool server = env.rank < job.servers;
  Workload task = make_workload(t, {}, {}, /*init=*/!(server && resume));
  std::optional<RunDirectory> run_dir;
  if (env.rank == 0) {
    const bool own_ckpt_dir = t.checkpoint.own_dir;
    run_dir.emplace(RunDirectory::claim(job.run, resume || restarted ? RunDirectory::Mode::kResume
                                                 : a.restart ? RunDirectory::Mode::kRestart
                                                             : RunDirectory::Mode::kFresh,
                                        own_ckpt_dir ? job.ckpt_root : ""));
  }
  std::unique_ptr<comm::TcpStoreServer> store_server;
  std::unique_ptr<comm::Store> store;
  auto world = comm::join_world(
      env, {.transport = t.comm.transport, .timeout = std::chrono::milliseconds(static_cast<int64_t>(t.comm.timeout_s * 1000))},
      store_server, store);
  check_same_layout(*world, t.layout);
  job.store = store.get();
  job.trace_steps = t.profile.steps;
  if (!job.trace_steps.empty()) {
    comm::barrier(*world);  // every rank's origin: the barrier's exit
    job.trace_origin = Clock::now();
  }
  if (env.rank == 0) store->set(kLayout, cat(world->size(), "\n", t.layout), comm::Clock::now() + world->config().timeout);
  // Async and ssp go on without a worker that dies: its launcher is told not to stop the job.
  if (!server && job.mode != parallel::PsMode::kSync)
    store->set(expendable_key(env.rank), "1", comm::Clock::now() + world->config().timeout);
  install_fault_hook(t.debug.fault_at, env.rank);
  // Which host each rank is on (its first rank there); in sync mode the workers of a host
  // sum their gradients first and one of them talks to the servers, as BytePS does.
  int host = world->local_ranks().front();
  std::vector<int> hosts(static_cast<size_t>(world->size()));
  comm::all_gather(*world, {.input = &host, .output = hosts.data(), .count = 1, .dtype = DType::kI32});
  // A host's workers sum first (sync only) when asked ("on"), or ("auto") when they are
  // several and some server is on another host: their links then cross the network, and one
  // push per host saves it the others'. On one host the links are shared memory already.
  const std::string& how = t.parallel.ps.hierarchical;
  auto grouped = [&](int h) {
    if (job.mode != parallel::PsMode::kSync || how == "off") return false;
    if (how == "on") return true;
    int workers_here = 0;
    bool server_elsewhere = false;
    for (int r = 0; r < world->size(); ++r) {
      if (r < job.servers) server_elsewhere = server_elsewhere || hosts[r] != h;
      else workers_here += hosts[r] == h ? 1 : 0;
    }
    return workers_here > 1 && server_elsewhere;
  };
  for (int r = job.servers; r < world->size(); ++r) {
    bool first_on_host = true;
    for (int q = job.servers; q < r && grouped(hosts[r]); ++q) first_on_host = first_on_host && hosts[q] != hosts[r];
    if (first_on_host) job.leaders.push_back(r);
  }
  auto group = world->split(server ? 0 : -1, world->rank());  // the servers
  auto local = world->split(server ? -1 : grouped(hosts[env.rank]) ? hosts[env.rank] : env.rank, env.rank);  // a host's workers
  const std::vector<std::unique_ptr<comm::Communicator>> links = make_links(job, *world, *store);
  log_info(cat("training ", t.model.preset, " (", task.model->params().numel(), " parameters) on ", t.data.train, ": ",
               job.steps, " steps of ", job.global_batch, " x ", task.train->tokens_per_example(), " tokens, ", job.servers,
               " parameter server(s) and ", job.workers, " worker(s), ", t.parallel.ps.mode,
               job.mode == parallel::PsMode::kSsp ? cat(" (staleness ", t.parallel.ps.staleness, ")") : std::string(),
               t.parallel.deterministic ? ", deterministic" : "",
               static_cast<int>(job.leaders.size()) < job.workers
                   ? cat(", the workers of each host summing first (", job.leaders.size(), " link(s) per server)")
                   : std::string(),
               "; run directory ", job.run));
  try {
    return server ? serve(job, a, resume, task, *world, *group, raw(links))
                  : work(job, task, env.rank - job.servers, env.rank, *local, raw(links));
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat("rank ", env.rank, " (", server ? "parameter server " : "worker ",
                           server ? env.rank : env.rank - job.servers, "): ", e.what()));
  }
}

int run_ps_join(Config c, const TrainArgs& a) {
  if (a.resume || a.restart || !a.init_from.empty())
    throw InputError("--ps-join with --resume, --restart or --init-from: a joining worker takes the job's parameters; "
                     "expected none of them");
  const comm::LaunchEnv env = comm::launch_env_from_environment();
  const auto [host, port] = parse_master(a.ps_join);
  if (port == 0) throw InputError(cat("--ps-join ", a.ps_join, ": expected the job's store as HOST:PORT with its port"));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(c.f("comm.timeout_s") * 1000));
  comm::TcpStore store({.host = host, .port = port, .secret = env.secret, .job_id = env.job_id}, comm::Clock::now() + timeout);
  // The job's world and layout, which this worker's config must match.
  const std::string published = store.get(kLayout, comm::Clock::now() + timeout);
  const size_t nl = published.find('\n');
  const int world = std::stoi(published.substr(0, nl));
  c.resolve(world);
  const TrainConfig t = train_config(c, 1);
  if (t.layout != published.substr(nl + 1))
    throw InputError(cat("--ps-join ", a.ps_join, ": this worker's layout \"", t.layout, "\" is not the job's \"",
                         published.substr(nl + 1), "\"; join with the job's config"));
  const parallel::PsMode mode = parallel::ps_mode_named(t.parallel.ps.mode);
  if (t.parallel.ps.servers == 0 || mode == parallel::PsMode::kSync)
    throw InputError(cat("--ps-join ", a.ps_join, ": the job trains ",
                         t.parallel.ps.servers == 0 ? std::string("without parameter servers")
                                                         : std::string("in sync mode, whose steps need a fixed set of workers"),
                         "; workers join async and ssp jobs"));
  set_log_quiet(a.quiet);
  apply_compute_settings(c, 1);
  const Job job = make_job(t, world);
  Workload task = make_workload(t);
  const int64_t k = store.add(kJoins, 1, comm::Clock::now() + timeout) - 1;
  const int rank = world + static_cast<int>(k);
  std::vector<std::unique_ptr<comm::Communicator>> links;
  for (int s = 0; s < job.servers; ++s)
    links.push_back(comm::Communicator::create(
        store, 1, 2,
        {.transport = t.comm.transport, .timeout = timeout, .job_id = env.job_id, .secret = env.secret,
         .job_ranks = {s, rank}},
        cat("ps/", s, "/j", k)));
  // It takes the data shard of the worker it most likely replaces.
  const int w = static_cast<int>(k % job.workers);
  log_info(cat("joined the parameter-server job at ", a.ps_join, " as worker rank ", rank, " (data shard of worker ", w,
               ")"));
  comm::HashStore own;
  auto self = comm::Communicator::create(own, 0, 1, {.timeout = timeout}, "self");
  try {
    return work(job, task, w, rank, *self, raw(links));
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat("joined worker rank ", rank, ": ", e.what()));
  }
}

}  // namespace loom::app
