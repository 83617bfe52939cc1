// Parameter servers, ranks as threads (STYLE.md rule 9): sync mode is bitwise equal to one
// process in deterministic mode (gpt-nano, 2 servers and 3 workers); async applies every
// push as it arrives; ssp holds a fast worker exactly K steps ahead of a slow one; a worker
// that leaves is dropped and the others finish.
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <mutex>
#include <thread>

#include "loom/data/data.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/optimizer_step.h"
#include "loom/nn/gpt.h"
#include "loom/parallel/param_server.h"
#include "loom/comm/rendezvous.h"
#include "loom/core/threads.h"
#include "loom_testing.h"

namespace loom::parallel {
namespace {

using std::chrono::milliseconds;

const comm::CommConfig kComm{.timeout = milliseconds(60000)};

// A job of `servers` + `workers` ranks as threads: server(s, links, servers_comm) and
// worker(w, links) run with their pair communicators built as loom train builds them.
void run_job(int servers, int workers,
             const std::function<void(int, std::vector<comm::Communicator*>, comm::Communicator&)>& server,
             const std::function<void(int, std::vector<comm::Communicator*>)>& worker) {
  comm::HashStore store;
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  auto guard = [&](auto fn) {
    try {
      fn();
    } catch (...) {
      std::lock_guard lock(mu);
      if (!first) first = std::current_exception();
    }
  };
  auto pair = [&](int s, int w, int me) {
    comm::CommConfig c = kComm;
    c.job_ranks = {s, servers + w};
    return comm::Communicator::create(store, me, 2, c, cat("ps/", s, "/", w));
  };
  for (int s = 0; s < servers; ++s)
    threads.emplace_back([&, s] {
      guard([&] {
        auto group = comm::Communicator::create(store, s, servers, kComm, "servers");
        std::vector<std::unique_ptr<comm::Communicator>> own;
        std::vector<comm::Communicator*> links;
        for (int w = 0; w < workers; ++w) links.push_back(own.emplace_back(pair(s, w, 0)).get());
        server(s, links, *group);
      });
    });
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      guard([&] {
        std::vector<std::unique_ptr<comm::Communicator>> own;
        std::vector<comm::Communicator*> links;
        for (int s = 0; s < servers; ++s) links.push_back(own.emplace_back(pair(s, w, 1)).get());
        worker(w, links);
      });
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// ---- sync: gpt-nano, bitwise equal to one process ----

constexpr int kSteps = 12;
constexpr int64_t kGlobalBatch = 6;
const nn::GptConfig kModel{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256};
const optim::ScheduleConfig kSchedule{.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 3, .total_steps = kSteps};

const std::vector<uint16_t>& tokens() {
  static const std::vector<uint16_t> t = loom::testing::phrase_tokens(40000);
  return t;
}

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> weights;
};

// Worker `rank` of `n` (or one process, n = 1): its items of each step, micro-batch 1, the
// gradients summed by a DataParallel of its own (deterministic).
struct Replica {
  nn::Gpt gpt{kModel};
  comm::HashStore store;
  std::unique_ptr<comm::Communicator> self = comm::Communicator::create(store, 0, 1, kComm);
  DataParallel dp{*self, gpt.params(), {.deterministic = true}, gpt.block_offsets()};
  OptimizerStep dp_update{dp, {.weight_decay = 0.1}};  // one process's update (workers push instead)
  data::Sampler sampler{(static_cast<int64_t>(tokens().size()) - 1) / kModel.seq_len, 5};
  nn::GptCtx ctx;

  Replica() {
    gpt.hooks().add([this](int block, BlockPhase phase) { dp.on_block(block, phase); });
  }

  std::vector<double> micro_steps(int step, int rank, int n) {
    const int64_t t = kModel.seq_len, accum = kGlobalBatch / n;
    dp.begin_step();
    std::vector<double> losses;
    for (int64_t m = 0; m < accum; ++m) {
      dp.begin_micro_step(m == accum - 1);
      Tensor x = Tensor::zeros({1, t}, DType::kI32), y = Tensor::zeros({1, t}, DType::kI32);
      const int64_t w = sampler.item(step * kGlobalBatch + rank * accum + m);
      for (int64_t j = 0; j < t; ++j) {
        x.data<int32_t>()[j] = tokens()[w * t + j];
        y.data<int32_t>()[j] = tokens()[w * t + j + 1];
      }
      losses.push_back(gpt.forward(x, y, ctx));
      gpt.backward(ctx, 1.0 / static_cast<double>(kGlobalBatch));
      dp.end_micro_step();
    }
    return losses;
  }
};

Result one_process() {
  Replica r;
  r.gpt.init(1234);
  Result out;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<double> micro = r.micro_steps(step, 0, 1);
    out.losses.push_back(r.dp.mean_loss(micro));
    out.norms.push_back(r.dp_update.step(optim::lr_at(kSchedule, step), 1.0));
  }
  const float* w = r.gpt.params().values().data<float>();
  out.weights.assign(w, w + r.gpt.params().numel());
  return out;
}

TEST(ParamServer, SyncDeterministicIsBitwiseEqualToOneProcess) {
  set_compute_threads(1);
  const Result want = one_process();
  constexpr int kServers = 2, kWorkers = 3;
  std::vector<Result> got(kWorkers);
  std::vector<std::vector<float>> server_weights(kServers);
  run_job(
      kServers, kWorkers,
      [&](int s, std::vector<comm::Communicator*> links, comm::Communicator& group) {
        nn::Gpt gpt(kModel);
        gpt.init(1234);
        const std::vector<int64_t> b = ps_key_ranges(gpt.params().numel(), kServers);
        ParamServer server(links, group, gpt.params(), b[s], b[s + 1], {.weight_decay = 0.1},
                           {.mode = PsMode::kSync, .deterministic = true, .workers = kWorkers, .steps = kSteps,
                            .schedule = kSchedule, .max_norm = 1.0});
        server.serve();
        EXPECT_EQ(server.steps_done(), kSteps);
        const float* v = gpt.params().values().data<float>();
        server_weights[s].assign(v + b[s], v + b[s + 1]);
      },
      [&](int w, std::vector<comm::Communicator*> links) {
        Replica r;
        r.gpt.init(99);  // the first pull replaces these
        PsWorker worker(links, r.gpt.params(), ps_key_ranges(r.gpt.params().numel(), kServers), PsMode::kSync);
        PsReply reply = worker.hello(kGlobalBatch / kWorkers);
        EXPECT_EQ(reply.step, 0);
        for (int step = 0; !reply.stop; ++step) {
          const std::vector<double> losses = r.micro_steps(step, w, kWorkers);
          const DataParallel::Gradients g = r.dp.finish_gradients();
          reply = worker.push_pull({.step = step, .grads = g.sums, .losses = losses, .unsummable = g.unsummable});
          got[w].losses.push_back(reply.loss);
          got[w].norms.push_back(reply.grad_norm);
          EXPECT_EQ(reply.staleness, 0);
        }
        worker.goodbye();
        const float* v = r.gpt.params().values().data<float>();
        got[w].weights.assign(v, v + r.gpt.params().numel());
      });
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(got[w].losses.size(), want.losses.size()) << "worker " << w;
    for (size_t s = 0; s < want.losses.size(); ++s) {
      EXPECT_EQ(got[w].losses[s], want.losses[s]) << "worker " << w << " step " << s + 1;
      EXPECT_EQ(got[w].norms[s], want.norms[s]) << "worker " << w << " step " << s + 1;
    }
    EXPECT_TRUE(got[w].weights == want.weights) << "worker " << w << "'s final weights differ";
  }
  std::vector<float> servers_hold;
  for (const auto& part : server_weights) servers_hold.insert(servers_hold.end(), part.begin(), part.end());
  EXPECT_TRUE(servers_hold == want.weights) << "the servers' ranges differ from one process's weights";
  EXPECT_LT(want.losses.back(), want.losses.front() - 0.3) << "the model did not learn";
}

TEST(ParamServer, KeyRangesAreBalancedAndAligned) {
  EXPECT_EQ(ps_key_ranges(100, 1), (std::vector<int64_t>{0, 100}));
  const std::vector<int64_t> b = ps_key_ranges(1000003, 3);
  ASSERT_EQ(b.size(), 4u);
  for (int s = 1; s < 3; ++s) {
    EXPECT_EQ(b[s] % 16, 0);
    EXPECT_NEAR(static_cast<double>(b[s]), 1000003.0 * s / 3, 16);
  }
  EXPECT_EQ(ps_key_ranges(5, 4), (std::vector<int64_t>{0, 0, 0, 0, 5}));  // too small to split: one holds it
}

// ---- async and ssp: synthetic gradients, plain SGD, so every update is known ----

constexpr int64_t kN = 1000;

struct Flat {
  ParamSet params;
  Flat() {
    params.add("w", {kN}, ParamKind::kWeight);
    params.allocate();
  }
};

// Worker w pushes gradients of all (w + 1); with SGD at lr 1 a push (the schedule's lr /
// workers), no decay and no momentum, every parameter ends at -(sum over applied pushes of
// w + 1).
struct AsyncRun {
  PsMode mode = PsMode::kAsync;
  int64_t staleness = 0;
  int servers = 2, workers = 3, steps = 6;
  int slow = -1;             // this worker sleeps slow_ms before each push
  int64_t slow_ms = 0;
  int leaves_after = -1;     // worker 2 stops after this many steps without a goodbye
};

struct AsyncResult {
  std::vector<int64_t> applied;  // per worker: pushes the servers applied
  std::vector<float> final_values;  // server-side, concatenated
  std::vector<std::string> drops;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> fast_seen;  // per worker: (step, slow's pushes begun) at each reply
  std::vector<std::vector<double>> held;  // per worker, per reply
  int64_t slow_staleness = 0;  // the most its replies named (pushes applied since its pull)
};

AsyncResult run_async(const AsyncRun& run) {
  AsyncResult res;
  res.applied.assign(static_cast<size_t>(run.workers), 0);
  res.fast_seen.resize(static_cast<size_t>(run.workers));
  res.held.resize(static_cast<size_t>(run.workers));
  std::vector<std::vector<float>> parts(static_cast<size_t>(run.servers));
  std::atomic<int64_t> slow_begun{0};
  std::mutex mu;
  int others_done = 0;                  // under mu
  std::latch all_pulled(run.workers);  // every worker holds its first parameters before any pushes
  const auto others_applied = [&] {  // under mu
    int64_t n = 0;
    for (int v = 0; v < run.workers; ++v) n += v == run.slow ? 0 : res.applied[v];
    return n;
  };
  run_job(
      run.servers, run.workers,
      [&](int s, std::vector<comm::Communicator*> links, comm::Communicator& group) {
        Flat f;
        const std::vector<int64_t> b = ps_key_ranges(kN, run.servers);
        ParamServer server(links, group, f.params, b[s], b[s + 1], {.kind = "sgd", .weight_decay = 0, .momentum = 0},
                           {.mode = run.mode, .staleness = run.staleness, .workers = run.workers, .steps = run.steps,
                            .schedule = {.lr = static_cast<double>(run.workers), .decay = "constant"}});  // 1 a push
        server.on_drop([&](int rank, const std::string& why) {
          std::lock_guard lock(mu);
          res.drops.push_back(cat("worker rank ", rank, ": ", why));
        });
        server.serve();
        const float* v = f.params.values().data<float>();
        parts[s].assign(v + b[s], v + b[s + 1]);
      },
      [&](int w, std::vector<comm::Communicator*> links) {
        Flat f;
        PsWorker worker(links, f.params, ps_key_ranges(kN, run.servers), run.mode);
        PsReply reply = worker.hello(1);
        all_pulled.arrive_and_wait();
        int64_t others_at_pull = 0;  // the slow worker: the others' applied pushes it had seen
        Tensor g = Tensor::zeros({kN}, DType::kF32);
        std::fill_n(g.data<float>(), kN, static_cast<float>(w + 1));
        for (int64_t step = reply.step; !reply.stop; ++step) {
          if (w == 2 && step == run.leaves_after) return;  // its links close without a goodbye
          if (run.mode == PsMode::kAsync && run.leaves_after >= 0 && step == run.leaves_after + 1) {
            // The others could otherwise finish the run's pushes before a busy server reads
            // the closed links: a drop the run would never need to notice.
            for (int i = 0; i < 10000; ++i) {
              {
                std::lock_guard lock(mu);
                if (res.drops.size() == static_cast<size_t>(run.servers)) break;
              }
              std::this_thread::sleep_for(milliseconds(1));
            }
          }
          if (w == run.slow) {
            std::this_thread::sleep_for(milliseconds(run.slow_ms));
            // async: at least one of the others' pushes lands between this worker's pull and
            // its push however the threads are scheduled (each other worker may have one
            // push applied but not yet counted here, so one more than their number).
            for (int i = 0; run.mode == PsMode::kAsync && i < 10000; ++i) {
              {
                std::lock_guard lock(mu);
                if (others_applied() > others_at_pull + run.workers - 1 || others_done == run.workers - 1) break;
              }
              std::this_thread::sleep_for(milliseconds(1));
            }
            slow_begun.fetch_add(1);
          }
          reply = worker.push_pull({.step = step, .grads = g, .losses = {1.0 * w}});
          if (reply.applied) {
            std::lock_guard lock(mu);
            ++res.applied[w];
            if (w == run.slow) {
              others_at_pull = others_applied();
              res.slow_staleness = std::max(res.slow_staleness, reply.staleness);
            }
            if (!reply.stop) {  // the run's last replies wait for nobody
              res.fast_seen[w].emplace_back(step, slow_begun.load());
              res.held[w].push_back(reply.held_ms);
            }
          }
        }
        worker.goodbye();
        std::lock_guard lock(mu);
        if (w != run.slow) ++others_done;
      });
  for (const auto& p : parts) res.final_values.insert(res.final_values.end(), p.begin(), p.end());
  return res;
}

TEST(ParamServer, AsyncAppliesEveryPushAsItArrives) {
  const AsyncResult r = run_async({.mode = PsMode::kAsync, .slow = 0, .slow_ms = 20});
  int64_t total = 0;
  double want = 0;
  for (int w = 0; w < 3; ++w) {
    total += r.applied[w];
    want -= static_cast<double>(r.applied[w]) * (w + 1);
  }
  EXPECT_GE(total, 6 * 3) << "steps x workers pushes make the run";
  EXPECT_LE(total, 6 * 3 + 2) << "and those in flight when it ends";
  EXPECT_LT(2 * r.applied[0], r.applied[1] + r.applied[2]) << "the slow worker should push less often than the fast ones";
  ASSERT_EQ(r.final_values.size(), static_cast<size_t>(kN));
  for (float v : r.final_values) ASSERT_EQ(v, static_cast<float>(want));
  EXPECT_GT(r.slow_staleness, 0) << "fast workers' pushes land between the slow one's pull and push";
  EXPECT_TRUE(r.drops.empty());
}

TEST(ParamServer, SspHoldsFastWorkersExactlyStalenessStepsAhead) {
  for (int64_t k : {0, 2}) {
    const AsyncResult r = run_async({.mode = PsMode::kSsp, .staleness = k, .servers = 1, .steps = 8, .slow = 0, .slow_ms = 60});
    for (int w = 1; w < 3; ++w) {
      bool held_at_k = false;
      for (size_t i = 0; i < r.fast_seen[w].size(); ++i) {
        const auto [step, slow_begun] = r.fast_seen[w][i];
        // The reply to step t lets the worker start step t + 1: the slow worker must have
        // pushed (so begun) its step t - K by then.
        EXPECT_GE(slow_begun, step - k + 1) << "K " << k << ": worker " << w << " ran past the bound at step " << step;
        if (step < k) {
          EXPECT_LT(r.held[w][i], 30) << "K " << k << ": worker " << w << " held within the bound";
        }
        if (step >= k && r.held[w][i] > 30) held_at_k = true;
      }
      EXPECT_TRUE(held_at_k) << "K " << k << ": worker " << w << " was never held waiting for the slow worker";
    }
  }
}

TEST(ParamServer, AsyncDropsAWorkerThatLeavesAndFinishesWithTheOthers) {
  const AsyncResult r = run_async({.mode = PsMode::kAsync, .steps = 8, .leaves_after = 2});
  ASSERT_EQ(r.drops.size(), 2u) << "one drop per server";
  EXPECT_NE(r.drops[0].find("worker rank 4"), std::string::npos) << r.drops[0];  // servers 0-1, workers 2-4
  EXPECT_EQ(r.applied[2], 2);
  EXPECT_GE(r.applied[0] + r.applied[1] + r.applied[2], 8 * 3) << "the others take over the rest of the run";
  EXPECT_LE(r.applied[0] + r.applied[1] + r.applied[2], 8 * 3 + 1);
}

TEST(ParamServer, SyncStopsNamingAWorkerThatLeaves) {
  try {
    run_async({.mode = PsMode::kSync, .steps = 6, .leaves_after = 2});
    FAIL() << "expected a RuntimeError";
  } catch (const RuntimeError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("worker rank 4") != std::string::npos || what.find("stopped the run") != std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace loom::parallel
