// Pipeline parallelism equals serial (STYLE.md rule 7): ranks as threads train a GPT
// split into stages (and data-parallel replicas of the pipeline) and are compared with
// one process accumulating the same micro-batches. Deterministic mode: losses, gradient
// norms and final weights bitwise equal, for every schedule the executor runs.
#include <gtest/gtest.h>

#include <map>

#include "../comm/comm_testing.h"
#include "loom/data/data.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/optimizer_step.h"
#include "loom/nn/gpt.h"
#include "loom/parallel/pipeline.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "loom_testing.h"

namespace loom::parallel {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 8;
// gpt-nano's width with 12 blocks: divisible among 2, 3 and 4 stages and 2 or 3 chunks.
const nn::GptConfig kModel{.n_layer = 12, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab_size = 256};

const std::vector<uint16_t>& tokens() {
  static const std::vector<uint16_t> t = loom::testing::phrase_tokens(20000);
  return t;
}

struct Layout {
  int dp = 1, pp = 1, virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int zero = 0;
  bool deterministic = true;
  DType precision = DType::kF32;  // mixed precision (nn::Gpt::set_precision)
};

struct Result {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;  // by parameter name
  std::vector<int> peak_in_flight;                   // per stage (pipelines only)
};

const int64_t kT = kModel.seq_len;

std::pair<Tensor, Tensor> micro_batch(data::Sampler& sampler, int step, int64_t first_item) {
  Tensor x = Tensor::zeros({1, kT}, DType::kI32), y = Tensor::zeros({1, kT}, DType::kI32);
  const int64_t w = sampler.item(step * kGlobalBatch + first_item);
  for (int64_t j = 0; j < kT; ++j) {
    x.data<int32_t>()[j] = tokens()[w * kT + j];
    y.data<int32_t>()[j] = tokens()[w * kT + j + 1];
  }
  return {x, y};
}

void keep_weights(const nn::Gpt& gpt, Result& r) {
  for (size_t i = 0; i < gpt.params().infos().size(); ++i) {
    Tensor v = gpt.params().value(static_cast<int>(i));
    r.weights[gpt.params().infos()[i].name].assign(v.data<float>(), v.data<float>() + v.numel());
  }
}

const optim::ScheduleConfig kSched{.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 2, .total_steps = kSteps};
// Each rank its own (a Sampler caches its epoch's order).
data::Sampler sampler() { return data::Sampler((static_cast<int64_t>(tokens().size()) - 1) / kT, 5); }

// One process, one replica: what `loom train` does without pipelining.
Result reference(bool deterministic, DType precision = DType::kF32) {
  Result r;
  comm::testing::run_ranks(1, {}, [&](comm::Communicator& c) {
    nn::Gpt gpt(kModel);
    gpt.init(1234);
    gpt.set_precision(precision);
    DataParallel dp(c, gpt.params(), {.deterministic = deterministic}, gpt.block_offsets());
    OptimizerStep dp_update(dp, {.weight_decay = 0.1});
    gpt.hooks().add([&](int block, BlockPhase phase) { dp.on_block(block, phase); });
    nn::GptCtx ctx;
    data::Sampler order = sampler();
    for (int step = 0; step < kSteps; ++step) {
      dp.begin_step();
      std::vector<double> micro;
      for (int64_t m = 0; m < kGlobalBatch; ++m) {
        dp.begin_micro_step(m == kGlobalBatch - 1);
        auto [x, y] = micro_batch(order, step, m);
        micro.push_back(gpt.forward(x, y, ctx));
        gpt.backward(ctx, 1.0 / static_cast<double>(kGlobalBatch));
        dp.end_micro_step();
      }
      r.losses.push_back(dp.mean_loss(micro));
      r.norms.push_back(dp_update.step(optim::lr_at(kSched, step), 1.0));
    }
    keep_weights(gpt, r);
  });
  return r;
}

// One rank of a dp x pp mesh (rank = pp_index * dp + dp_index).
void train_rank(comm::Communicator& world, const Layout& run, std::vector<Result>& results) {
  const int dp_i = world.rank() % run.dp, st = world.rank() / run.dp;
  std::unique_ptr<comm::Communicator> dp_comm = world.split(st, dp_i);
  std::unique_ptr<comm::Communicator> pp_comm = world.split(dp_i, st);
  // The first and last stage share the tied embedding.
  std::unique_ptr<comm::Communicator> tied = pp_comm->split(st == 0 || st == run.pp - 1 ? 0 : -1, st);

  // Each stage initializes its part: the same weights one process draws (Gpt::init).
  nn::Gpt gpt(kModel, DType::kF32, stage_part(kModel.n_layer, run.pp, run.virtual_stages, st));
  gpt.init(1234);
  gpt.set_precision(run.precision);

  // Each block's gradients summed over the replicas as soon as the stage's last piece of
  // its chunk has computed them, as parallelize() does.
  DataParallel dp(*dp_comm, gpt.params(), {.zero = run.zero, .deterministic = run.deterministic},
                  gpt.block_offsets());
  OptimizerStep dp_update(dp, {.weight_decay = 0.1});
  gpt.hooks().add([&](int block, BlockPhase phase) { dp.on_block(block, phase); });
  StageGroups groups{.stages = pp_comm.get(), .tied = tied.get()};
  const int wte = gpt.params().find("transformer.wte.weight");
  if (wte >= 0 && run.pp > 1) {
    const ParamInfo& info = gpt.params().infos()[wte];
    groups.tied_begin = info.offset;
    groups.tied_end = info.offset + info.numel;
    if (st == run.pp - 1) groups.skip = {{info.offset, info.offset + info.numel}};
  }
  dp.set_stage_groups(groups);
  dp.sync_params();
  const int64_t m_count = kGlobalBatch / run.dp;
  Pipeline pipe(*pp_comm, make_schedule(run.schedule, run.pp, static_cast<int>(m_count), run.virtual_stages), gpt);
  Result r;
  data::Sampler order = sampler();
  for (int step = 0; step < kSteps; ++step) {
    dp.begin_step();
    std::vector<double> micro = pipe.run(
        [&](int mb) { return micro_batch(order, step, dp_i * m_count + mb); }, 1, kT,
        1.0 / static_cast<double>(kGlobalBatch),
        {.begin = [&](const Pipeline::Piece& p) { dp.begin_micro_step(p.final); },
         .end = [&](const Pipeline::Piece& p) { dp.end_micro_step(static_cast<int>(p.from_block)); }});
    // The last stage's losses, to every stage.
    micro.resize(static_cast<size_t>(m_count));
    comm::broadcast(*pp_comm, {.buffer = micro.data(), .count = micro.size(), .dtype = DType::kF64, .root = run.pp - 1});
    dp.sum_tied_gradients();
    dp.begin_micro_step(true);
    dp.end_micro_step();
    r.losses.push_back(dp.mean_loss(micro));
    r.norms.push_back(dp_update.step(optim::lr_at(kSched, step), 1.0));
  }
  // The last step action by action (what the simulator replays) adds up to its totals.
  const PipelineStats& ps = pipe.stats();
  EXPECT_EQ(ps.action_compute_ms.size(), pipe.schedule().actions[st].size());
  EXPECT_EQ(ps.action_overhead_ms.size(), pipe.schedule().actions[st].size());
  double compute = 0, overhead = 0;
  for (double ms : ps.action_compute_ms) compute += ms;
  for (double ms : ps.action_overhead_ms) overhead += ms;
  EXPECT_NEAR(compute, ps.busy_ms, 1e-9 * ps.step_ms);
  EXPECT_NEAR(compute + overhead + ps.wait_ms, ps.step_ms, 1e-6 * ps.step_ms);
  // Actions begin in list order within the step; a receive's message lands after its posting.
  const auto& list = pipe.schedule().actions[st];
  ASSERT_EQ(ps.action_begin_ms.size(), list.size());
  ASSERT_EQ(ps.action_landed_ms.size(), list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    EXPECT_GE(ps.action_begin_ms[i], i == 0 ? ps.start_ms : ps.action_begin_ms[i - 1]) << i;
    EXPECT_LE(ps.action_begin_ms[i], ps.start_ms + ps.step_ms) << i;
    const bool recv = list[i].op == PipeOp::kRecvActivation || list[i].op == PipeOp::kRecvGrad;
    if (recv) EXPECT_GE(ps.action_landed_ms[i], ps.action_begin_ms[i]) << i;
    else EXPECT_EQ(ps.action_landed_ms[i], 0.0) << i;
  }
  keep_weights(gpt, r);
  r.peak_in_flight.push_back(ps.peak_in_flight);
  results[world.rank()] = std::move(r);
}

// Every rank's weights merged by name (a tied copy must equal the original), rank 0's
// losses and norms after checking every rank agrees.
Result train(const Layout& run) {
  const int n = run.dp * run.pp;
  std::vector<Result> results(static_cast<size_t>(n));
  comm::testing::run_ranks(n, {.timeout = std::chrono::milliseconds(60000)},
                           [&](comm::Communicator& c) { train_rank(c, run, results); });
  Result merged = results[0];
  merged.peak_in_flight.clear();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
    EXPECT_EQ(results[r].norms, results[0].norms) << "rank " << r;
    for (const auto& [name, w] : results[r].weights) {
      auto [it, fresh] = merged.weights.emplace(name, w);
      EXPECT_TRUE(fresh || it->second == w) << name << " differs on rank " << r;
    }
    if (r % run.dp == 0) merged.peak_in_flight.push_back(results[r].peak_in_flight[0]);
  }
  return merged;
}

const Result& deterministic_reference() {
  static const Result r = reference(true);
  return r;
}

class PipelineParity : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override { set_compute_threads(1); }
};

TEST_P(PipelineParity, DeterministicIsBitwiseEqualToOneProcess) {
  const Layout run = GetParam();
  const Result& want = deterministic_reference();
  const Result got = train(run);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  ASSERT_EQ(got.weights.size(), want.weights.size());
  for (const auto& [name, w] : want.weights) EXPECT_TRUE(got.weights.at(name) == w) << name;
  if (run.schedule == ScheduleKind::kOneFOneB) {  // 1F1B holds at most p - s micro-batches at stage s
    const int m = static_cast<int>(kGlobalBatch / run.dp);
    for (int s = 0; s < run.pp; ++s) EXPECT_EQ(got.peak_in_flight[s], std::min(run.pp - s, m)) << "stage " << s;
  }
  if (run.schedule == ScheduleKind::kZeroBubble) {  // ZB-H1: deferred weight passes, still at most p
    const int m = static_cast<int>(kGlobalBatch / run.dp);
    for (int s = 0; s < run.pp; ++s) EXPECT_LE(got.peak_in_flight[s], std::min(run.pp, m)) << "stage " << s;
  }
}

std::string run_name(const ::testing::TestParamInfo<Layout>& info) {
  const Layout& r = info.param;
  std::string s = schedule_kind_name(r.schedule);
  for (char& c : s)
    if (c == '-') c = '_';
  return cat("dp", r.dp, "_pp", r.pp, "_", s, r.virtual_stages > 1 ? cat("_v", r.virtual_stages) : "", "_zero", r.zero);
}

// Mixed precision through the stages: each block rounds as it does in one process, and
// what crosses a stage boundary holds 16-bit values already, so every schedule but
// zero-bubble's (whose deferred weight passes mixed precision refuses) is bitwise equal to
// one process in the same precision.
TEST(PipelineParity, MixedPrecisionIsBitwiseEqualToOneProcess) {
  set_compute_threads(1);
  for (DType format : {DType::kBF16, DType::kF16}) {
    const Result want = reference(true, format);
    EXPECT_NE(want.losses, deterministic_reference().losses) << dtype_name(format) << " rounded nothing";
    for (Layout run : {Layout{.pp = 2, .schedule = ScheduleKind::kGpipe},
                       Layout{.pp = 4, .virtual_stages = 3, .schedule = ScheduleKind::kInterleaved},
                       Layout{.dp = 2, .pp = 2, .schedule = ScheduleKind::kOneFOneB, .zero = 1}}) {
      run.precision = format;
      const Result got = train(run);
      const std::string what = cat(dtype_name(format), " pp ", run.pp, " ", schedule_kind_name(run.schedule));
      EXPECT_EQ(got.losses, want.losses) << what;
      EXPECT_EQ(got.norms, want.norms) << what;
      for (const auto& [name, w] : want.weights) EXPECT_TRUE(got.weights.at(name) == w) << what << " " << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllLayouts, PipelineParity,
    ::testing::Values(Layout{.pp = 2, .schedule = ScheduleKind::kGpipe}, Layout{.pp = 2, .schedule = ScheduleKind::kOneFOneB},
                    Layout{.pp = 2, .virtual_stages = 2, .schedule = ScheduleKind::kInterleaved},
                    Layout{.pp = 3, .schedule = ScheduleKind::kOneFOneB}, Layout{.pp = 4, .schedule = ScheduleKind::kOneFOneB},
                    Layout{.pp = 4, .virtual_stages = 3, .schedule = ScheduleKind::kInterleaved},
                    Layout{.dp = 2, .pp = 2, .schedule = ScheduleKind::kOneFOneB, .zero = 1},
                    Layout{.dp = 2, .pp = 2, .schedule = ScheduleKind::kGpipe, .zero = 2},
                    Layout{.dp = 2, .pp = 4, .schedule = ScheduleKind::kOneFOneB},
                    Layout{.pp = 2, .schedule = ScheduleKind::kZeroBubble}, Layout{.pp = 4, .schedule = ScheduleKind::kZeroBubble},
                    Layout{.dp = 2, .pp = 2, .schedule = ScheduleKind::kZeroBubble, .zero = 2}),
    run_name);

}  // namespace
}  // namespace loom::parallel
