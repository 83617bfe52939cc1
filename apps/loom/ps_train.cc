// `loom train` with parameter servers ([parallel] ps_servers = S, docs/parallelism.md
// "Parameter servers"): ranks 0..S-1 serve key ranges of the model, the others train.
// Rank 0, the first server, writes the run directory: metrics per step, evaluations and
// (with the other servers, each writing its range) checkpoints.
#include "ps_train.h"

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

namespace loom::app {
namespace fs = std::filesystem;
using json = nlohmann::json;
using ps::Clock;
using ps::Job;

namespace {

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
  if (trace) write_file_atomic(ps::trace_part(job, rank), trace->events(rank));
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
  std::optional<checkpoint::RunDirectory> run_dir;
  if (env.rank == 0) {
    const bool own_ckpt_dir = t.checkpoint.own_dir;
    run_dir.emplace(checkpoint::RunDirectory::claim(job.run, resume || restarted ? checkpoint::RunDirectory::Mode::kResume
                                                 : a.restart ? checkpoint::RunDirectory::Mode::kRestart
                                                             : checkpoint::RunDirectory::Mode::kFresh,
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
  if (env.rank == 0) store->set(ps::kLayout, cat(world->size(), "\n", t.layout), comm::Clock::now() + world->config().timeout);
  // Async and ssp go on without a worker that dies: its launcher is told not to stop the job.
  if (!server && job.mode != parallel::PsMode::kSync)
    store->set(launch::expendable_key(env.rank), "1", comm::Clock::now() + world->config().timeout);
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
  const std::vector<std::unique_ptr<comm::Communicator>> links = ps::make_links(job, *world, *store);
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
    return server ? ps::serve(job, a, resume, task, *world, *group, ps::raw(links))
                  : work(job, task, env.rank - job.servers, env.rank, *local, ps::raw(links));
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
  const auto [host, port] = launch::parse_master(a.ps_join);
  if (port == 0) throw InputError(cat("--ps-join ", a.ps_join, ": expected the job's store as HOST:PORT with its port"));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(c.f("comm.timeout_s") * 1000));
  comm::TcpStore store({.host = host, .port = port, .secret = env.secret, .job_id = env.job_id}, comm::Clock::now() + timeout);
  // The job's world and layout, which this worker's config must match.
  const std::string published = store.get(ps::kLayout, comm::Clock::now() + timeout);
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
  const int64_t k = store.add(ps::kJoins, 1, comm::Clock::now() + timeout) - 1;
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
    return work(job, task, w, rank, *self, ps::raw(links));
  } catch (const RuntimeError& e) {
    throw RuntimeError(cat("joined worker rank ", rank, ": ", e.what()));
  }
}

}  // namespace loom::app
