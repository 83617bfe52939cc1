// Data parallelism equals serial (STYLE.md rule 7): ranks as threads train gpt-nano for
// 20 steps and are compared with one process accumulating the same micro-batches.
// Deterministic mode: losses and final weights bitwise equal, for world sizes 1-4 (3
// included), each ZeRO stage, with and without gradient accumulation. Otherwise: within
// the tolerance docs/parallelism.md states.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "../comm/comm_testing.h"
#include "loom_testing.h"
#include "loom/data/data.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/optimizer_step.h"
#include "loom/nn/gpt.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "parallel/dp_comm.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
const nn::GptConfig kModel{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256};  // gpt-nano

const std::vector<uint16_t>& tokens() {
  static const std::vector<uint16_t> t = loom::testing::phrase_tokens(40000);
  return t;
}

struct Run {
  int ranks = 1;
  int64_t micro_batch = 1;
  DataParallelConfig dp;
  double grad_clip = 1.0;
  DType precision = DType::kF32;  // mixed precision (nn::Gpt::set_precision)
  double loss_scale = 1;          // fp16's: backward on the loss times this, the update divides
};

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> weights;
  bool grads_shared = false;  // DataParallel::grads_shared()
};

// One rank's training loop: what `loom train` does, minus files.
Result train_rank(comm::Communicator& comm, const Run& run) {
  nn::Gpt gpt(kModel);
  gpt.init(comm.rank() == 0 ? 1234 : 99);  // sync_params must make the others equal
  gpt.set_precision(run.precision);
  DataParallel dp(comm, gpt.params(), run.dp, gpt.block_offsets());
  OptimizerStep dp_update(dp, {.weight_decay = 0.1});
  gpt.hooks().add([&](int block, BlockPhase phase) { dp.on_block(block, phase); });
  dp.sync_params();
  const int64_t t = kModel.seq_len, n = comm.size();
  const int64_t windows = (static_cast<int64_t>(tokens().size()) - 1) / t;
  const int64_t per_rank = kGlobalBatch / n, accum = per_rank / run.micro_batch;
  data::Sampler sampler(windows, 5);
  nn::GptCtx ctx;
  Result r;
  optim::ScheduleConfig sched{.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 3, .total_steps = kSteps};
  for (int step = 0; step < kSteps; ++step) {
    dp.begin_step();
    std::vector<double> micro;
    for (int64_t m = 0; m < accum; ++m) {
      dp.begin_micro_step(m == accum - 1);
      Tensor x = Tensor::zeros({run.micro_batch, t}, DType::kI32), y = Tensor::zeros({run.micro_batch, t}, DType::kI32);
      for (int64_t i = 0; i < run.micro_batch; ++i) {
        const int64_t w = sampler.item(step * kGlobalBatch + comm.rank() * per_rank + m * run.micro_batch + i);
        for (int64_t j = 0; j < t; ++j) {
          x.data<int32_t>()[i * t + j] = tokens()[w * t + j];
          y.data<int32_t>()[i * t + j] = tokens()[w * t + j + 1];
        }
      }
      micro.push_back(gpt.forward(x, y, ctx));
      gpt.backward(ctx, run.loss_scale / static_cast<double>(accum * n));
      dp.end_micro_step();
    }
    r.losses.push_back(dp.mean_loss(micro));
    r.norms.push_back(dp_update.step(optim::lr_at(sched, step), run.grad_clip, run.loss_scale));
  }
  dp.materialize_params();
  r.grads_shared = dp.grads_shared();
  const float* w = gpt.params().values().data<float>();
  r.weights.assign(w, w + gpt.params().numel());
  return r;
}

// Runs `run` on ranks as threads; returns rank 0's result after checking every rank agrees.
Result train(const Run& run) {
  std::vector<Result> results(static_cast<size_t>(run.ranks));
  comm::testing::run_ranks(run.ranks, {.timeout = std::chrono::milliseconds(60000)},
                           [&](comm::Communicator& c) { results[c.rank()] = train_rank(c, run); });
  for (int r = 1; r < run.ranks; ++r) {
    EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
    EXPECT_TRUE(results[r].weights == results[0].weights) << "rank " << r << " ended with other weights";
  }
  return results[0];
}

// One process, deterministic, zero 0, for each micro-batch size (cached).
const Result& reference(int64_t micro_batch, bool deterministic, DType grad_dtype = DType::kF32) {
  static std::map<std::tuple<int64_t, bool, DType>, Result> cache;
  auto key = std::make_tuple(micro_batch, deterministic, grad_dtype);
  if (!cache.count(key))
    cache[key] = train({.ranks = 1, .micro_batch = micro_batch,
                        .dp = {.deterministic = deterministic, .grad_dtype = grad_dtype}});
  return cache[key];
}

class Parity : public ::testing::TestWithParam<std::tuple<int, int, bool>> {
 protected:
  void SetUp() override { set_compute_threads(1); }
};

// Small buckets so every run has several units, some uneven and some split mid-parameter.
constexpr double kBucketMb = 0.05;

TEST_P(Parity, DeterministicIsBitwiseEqualToOneProcess) {
  const auto [ranks, zero, accumulate] = GetParam();
  const int64_t micro = accumulate ? 1 : kGlobalBatch / ranks;
  Result got = train({.ranks = ranks, .micro_batch = micro,
                      .dp = {.zero = zero, .bucket_mb = kBucketMb, .deterministic = true}});
  const Result& want = reference(micro, true);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    EXPECT_EQ(got.losses[s], want.losses[s]) << "step " << s + 1;
    EXPECT_EQ(got.norms[s], want.norms[s]) << "step " << s + 1;
  }
  EXPECT_TRUE(got.weights == want.weights) << "final weights differ";
  EXPECT_LT(got.losses.back(), got.losses.front() - 0.5) << "the model did not learn";
}

TEST_P(Parity, DefaultModeIsWithinTolerance) {
  const auto [ranks, zero, accumulate] = GetParam();
  const int64_t micro = accumulate ? 1 : kGlobalBatch / ranks;
  Result got = train({.ranks = ranks, .micro_batch = micro, .dp = {.zero = zero, .bucket_mb = kBucketMb}});
  const Result& want = reference(micro, false);
  // f32 sums in another order: relative loss differences of ~1e-6 that training may grow;
  // docs/parallelism.md states 1e-4 relative over 20 steps.
  for (size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-4 * std::fabs(want.losses[s])) << "step " << s + 1;
}

INSTANTIATE_TEST_SUITE_P(WorldsStagesAccumulation, Parity,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return cat("n", std::get<0>(info.param), "_zero", std::get<1>(info.param),
                                      std::get<2>(info.param) ? "_accum" : "_noaccum");
                         });

// ZeRO 0 and 1 with units of 16 MiB or more keep the f32 gradients in shared memory, which
// the peers read in place (docs/parallelism.md, "Gradients in shared memory"). Summed in
// rank order either way, so the same bits as small units through the window.
TEST(DataParallel, GradientsReadInPlaceGiveTheSameBits) {
  set_compute_threads(1);
  for (int ranks : {2, 3})
    for (int zero : {0, 1}) {
      Result in_place = train({.ranks = ranks, .micro_batch = 2, .dp = {.zero = zero, .bucket_mb = 16}});
      Result through = train({.ranks = ranks, .micro_batch = 2, .dp = {.zero = zero, .bucket_mb = kBucketMb}});
      EXPECT_TRUE(in_place.grads_shared) << ranks << " ranks, zero " << zero;
      EXPECT_FALSE(through.grads_shared) << ranks << " ranks, zero " << zero;
      EXPECT_EQ(in_place.losses, through.losses) << ranks << " ranks, zero " << zero;
      EXPECT_TRUE(in_place.weights == through.weights) << ranks << " ranks, zero " << zero;
      EXPECT_LT(in_place.losses.back(), in_place.losses.front() - 0.5) << "the model did not learn";
    }
  Result two = train({.ranks = 2, .micro_batch = 2, .dp = {.zero = 2, .bucket_mb = 16}});
  EXPECT_FALSE(two.grads_shared) << "ZeRO 2 gives its gradient pages back, which shared memory would keep";
}

TEST(DataParallel, Bf16GradientsStayCloseToF32) {
  set_compute_threads(1);
  for (int zero : {0, 2, 3}) {
    Result got = train({.ranks = 2, .micro_batch = 2, .dp = {.zero = zero, .bucket_mb = kBucketMb, .grad_dtype = DType::kBF16}});
    const Result& want = reference(2, false);
    // bf16 keeps 8 bits of each summed gradient: the loss curve moves by ~1e-3 relative.
    for (size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], 2e-2 * want.losses[s]) << "zero " << zero << " step " << s + 1;
    EXPECT_NE(got.losses.back(), want.losses.back()) << "bf16 on the wire should not be bitwise f32";
  }
}

// ZeRO 3 with bf16 parameter gathers: the model computes with bf16-rounded weights while
// the f32 masters take the updates, so training follows f32 closely.
TEST(DataParallel, Bf16ParameterGathersStayCloseToF32) {
  set_compute_threads(1);
  for (int ranks : {2, 3}) {
    const int64_t micro = kGlobalBatch / ranks;
    Result got = train({.ranks = ranks, .micro_batch = micro,
                        .dp = {.zero = 3, .bucket_mb = kBucketMb, .param_dtype = DType::kBF16}});
    const Result& want = reference(micro, false);
    for (size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], 2e-2 * want.losses[s]) << ranks << " ranks, step " << s + 1;
    EXPECT_NE(got.losses.front(), want.losses.front()) << "the forward did not use bf16 weights";
    EXPECT_NE(got.weights, want.weights);
  }
}

// docs/parallelism.md's per-rank bytes for fp32 AdamW, P parameters, N ranks, measured as
// resident pages after a step: stage 0 16P, stage 1 8P + 8P/N, stage 2 4P + 12P/N, stage 3
// 16P/N.
// Mixed precision (docs/numerics.md, "Mixed precision") under data parallelism: in
// deterministic mode bf16, and fp16 with its loss scale, train at every ZeRO stage bitwise
// as one process does; their losses stay near f32's.
TEST(DataParallel, MixedPrecisionIsBitwiseOneProcessAtEveryZeroStage) {
  set_compute_threads(1);
  const Result& f32 = reference(kGlobalBatch / 2, true);
  for (auto [format, scale] : {std::pair{DType::kBF16, 1.0}, std::pair{DType::kF16, 1024.0}}) {
    const Result want = train({.ranks = 1, .micro_batch = kGlobalBatch / 2, .dp = {.deterministic = true},
                               .precision = format, .loss_scale = scale});
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_NEAR(want.losses[s], f32.losses[s], 0.02 * f32.losses[s]) << dtype_name(format) << " step " << s + 1;
    for (int zero : {0, 1, 2, 3}) {
      const Result got = train({.ranks = 2, .micro_batch = kGlobalBatch / 2,
                                .dp = {.zero = zero, .bucket_mb = kBucketMb, .deterministic = true},
                                .precision = format, .loss_scale = scale});
      EXPECT_EQ(got.losses, want.losses) << dtype_name(format) << " zero " << zero;
      EXPECT_EQ(got.norms, want.norms) << dtype_name(format) << " zero " << zero;
      EXPECT_TRUE(got.weights == want.weights) << dtype_name(format) << " zero " << zero;
    }
  }
}

TEST(DataParallel, StateBytesMatchTheZeroFormulas) {
  set_compute_threads(1);
  const int n = 4;
  comm::testing::run_ranks(n, {}, [&](comm::Communicator& c) {
    for (int zero : {0, 1, 2, 3}) {
      ParamSet ps;
      ps.add("a.weight", {1024, 1000}, ParamKind::kWeight);
      ps.add("a.bias", {1000}, ParamKind::kBias);
      ps.add("b.weight", {1000, 999}, ParamKind::kWeight);
      ps.allocate();
      DataParallel dp(c, ps, {.zero = zero, .bucket_mb = 2}, {0, ps.numel()});
      OptimizerStep dp_update(dp, {});
      dp.sync_params();
      dp.begin_step();
      dp.begin_micro_step(true);
      float* g = ps.grads().data<float>();
      for (int64_t i = 0; i < ps.numel(); ++i) g[i] = 1e-3f * static_cast<float>(i % 13);
      dp.end_micro_step();
      dp_update.step(1e-3, 1.0);
      const double p = static_cast<double>(ps.numel());
      const double want = zero == 0 ? 16 * p : zero == 1 ? 8 * p + 8 * p / n : zero == 2 ? 4 * p + 12 * p / n : 16 * p / n;
      StateBytes b = dp.state_bytes();
      b.optimizer = dp_update.state_bytes();
      EXPECT_NEAR(static_cast<double>(b.total()), want, 0.05 * want)
          << "zero " << zero << ": params " << b.params << " grads " << b.grads << " optimizer " << b.optimizer;
      if (zero >= 2) {
        EXPECT_LT(b.grads, 4 * p / n * 1.05) << "the full gradient buffer was not released";
      }
      if (zero == 3) {
        EXPECT_LT(b.params, 4 * p / n * 1.05) << "the full parameter buffer was not released";
      }
    }
  });
}

// ZeRO 3 holds the full values of a block only around its use: at every hook event the
// resident part of the flat parameter buffer is at most the rest plus two blocks (the one
// in use and the one prefetched), and a block entered holds exactly rank 0's values.
TEST(DataParallel, Zero3GathersEachBlockJustBeforeUseAndFreesItAfter) {
  set_compute_threads(1);
  const nn::GptConfig model{.n_layer = 4, .n_head = 2, .d_model = 64, .seq_len = 16, .vocab_size = 256};
  comm::testing::run_ranks(2, {}, [&](comm::Communicator& c) {
    nn::Gpt gpt(model), want(model);
    gpt.init(c.rank() == 0 ? 1234 : 99);
    want.init(1234);
    const std::vector<int64_t> off = gpt.block_offsets();
    DataParallel dp(c, gpt.params(), {.zero = 3, .bucket_mb = 0.05}, off);
    OptimizerStep dp_update(dp, {});
    dp.sync_params();
    const Tensor& values = gpt.params().values();
    const int64_t block_bytes = (off[1] - off[0]) * 4, rest_bytes = (gpt.params().numel() - (off[4] - off[0])) * 4;
    const int64_t bound = rest_bytes + 2 * block_bytes + 8 * 4096;  // + pages shared at range edges
    EXPECT_LT(resident_bytes(values.raw(), values.nbytes()), 8 * 4096) << "sync_params kept the full values";
    int64_t peak = 0;
    int entered = 0;
    gpt.hooks().add([&](int b, BlockPhase p) {
      dp.on_block(b, p);
      peak = std::max(peak, resident_bytes(values.raw(), values.nbytes()));
      if (b >= 0 && (p == BlockPhase::kForward || p == BlockPhase::kBackward)) {
        ++entered;
        EXPECT_EQ(0, std::memcmp(values.data<float>() + off[b], want.params().values().data<float>() + off[b],
                                 static_cast<size_t>(block_bytes)))
            << "block " << b << " entered without rank 0's values";
      }
    });
    Tensor x = Tensor::zeros({2, 16}, DType::kI32), y = Tensor::zeros({2, 16}, DType::kI32);
    for (int i = 0; i < 32; ++i) {
      x.data<int32_t>()[i] = (i * 7 + c.rank()) % 256;
      y.data<int32_t>()[i] = (i * 5 + 1) % 256;
    }
    nn::GptCtx ctx;
    dp.begin_step();
    dp.begin_micro_step(true);
    gpt.forward(x, y, ctx);
    gpt.backward(ctx, 0.5);
    dp.end_micro_step();
    dp_update.step(1e-3, 1.0);
    EXPECT_EQ(entered, 8);
    EXPECT_LE(peak, bound) << "gathered blocks were not freed after use";
    EXPECT_GT(peak, rest_bytes + block_bytes / 2);
    EXPECT_LT(resident_bytes(values.raw(), values.nbytes()), 8 * 4096) << "the step kept gathered values";
    dp.materialize_params();
    EXPECT_EQ(resident_bytes(values.raw(), values.nbytes()), values.nbytes());
    EXPECT_NE(0, std::memcmp(values.raw(), want.params().values().raw(), values.nbytes())) << "no update arrived";
  });
}

TEST(DataParallel, SyncParamsMakesRanksEqualAndOptimizerStateRoundTrips) {
  set_compute_threads(1);
  comm::testing::run_ranks(3, {}, [&](comm::Communicator& c) {
    nn::Gpt gpt(kModel);
    gpt.init(c.rank() + 1);
    DataParallel dp(c, gpt.params(), {.zero = 1, .bucket_mb = kBucketMb}, gpt.block_offsets());
    OptimizerStep dp_update(dp, {});
    dp.sync_params();
    nn::Gpt ref(kModel);
    ref.init(1);
    EXPECT_EQ(0, std::memcmp(ref.params().values().raw(), gpt.params().values().raw(), gpt.params().values().nbytes()));
    // Each rank fills what it keeps, in place, with a value of the flat index: gathered,
    // the whole layout holds every value in its place.
    auto value = [](const std::string& name, int64_t i) { return static_cast<float>(i % 977) * (name == "exp_avg" ? 1 : -1); };
    optim::RangeState kept = dp_update.kept_state();
    for (auto& [name, views] : kept.buffers)
      for (size_t r = 0; r < views.size(); ++r)
        for (int64_t i = 0; i < views[r].numel(); ++i) views[r].data<float>()[i] = value(name, kept.ranges[r].first + i);
    dp_update.set_steps(7);
    optim::FlatState back = dp_update.gather_state();
    EXPECT_EQ(back.steps, 7);
    for (const auto& [name, t] : back.buffers)
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<float>()[i], value(name, i)) << name << " " << i;
  });
}

// One rank's gradient turns NaN inside a block's backward (as a diverging step's would): in
// both modes and at every ZeRO stage, every rank gets a NaN norm, the same name for the
// first non-finite gradient, and parameters left as they were.
TEST(DataParallel, ANonFiniteGradientOnOneRankStopsTheStepOnEveryRank) {
  set_compute_threads(1);
  for (bool deterministic : {true, false}) {
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE(::testing::Message() << "deterministic " << deterministic << ", ZeRO " << zero);
      comm::testing::run_ranks(2, {.timeout = std::chrono::milliseconds(60000)}, [&](comm::Communicator& comm) {
        nn::Gpt gpt(kModel);
        gpt.init(1234);
        DataParallel dp(comm, gpt.params(), {.zero = zero, .bucket_mb = kBucketMb, .deterministic = deterministic},
                        gpt.block_offsets());
        OptimizerStep dp_update(dp, {});
        const ParamInfo* poisoned = nullptr;
        for (const ParamInfo& p : gpt.params().infos())
          if (p.name == "transformer.h.1.mlp.c_proj.weight") poisoned = &p;
        ASSERT_NE(poisoned, nullptr);
        gpt.hooks().add([&](int block, BlockPhase phase) {
          if (comm.rank() == 1 && block == 1 && phase == BlockPhase::kBackwardDone)
            gpt.params().grads().data<float>()[poisoned->offset + 5] = std::numeric_limits<float>::quiet_NaN();
          dp.on_block(block, phase);
        });
        dp.sync_params();
        dp.materialize_params();
        const std::vector<float> before(gpt.params().values().data<float>(),
                                        gpt.params().values().data<float>() + gpt.params().numel());
        const int64_t t = kModel.seq_len;
        Tensor x = Tensor::zeros({1, t}, DType::kI32), y = Tensor::zeros({1, t}, DType::kI32);
        for (int64_t j = 0; j < t; ++j) {
          x.data<int32_t>()[j] = tokens()[comm.rank() * t + j];
          y.data<int32_t>()[j] = tokens()[comm.rank() * t + j + 1];
        }
        dp.begin_step();
        dp.begin_micro_step(true);
        nn::GptCtx ctx;
        gpt.forward(x, y, ctx);
        gpt.backward(ctx, 0.5);
        dp.end_micro_step();
        EXPECT_TRUE(std::isnan(dp_update.step(1e-3, 1.0))) << "rank " << comm.rank();
        EXPECT_EQ(dp.first_nonfinite_gradient(), poisoned->name) << "rank " << comm.rank();
        dp.materialize_params();
        EXPECT_EQ(0, std::memcmp(before.data(), gpt.params().values().data<float>(), before.size() * sizeof(float)))
            << "rank " << comm.rank() << " updated its parameters";
      });
    }
  }
}

TEST(ExactSum, AnyGroupingGivesTheSameBits) {
  Rng rng(3, 0);
  std::vector<float> x(1000);
  for (float& v : x) v = static_cast<float>(rng.normal() * std::pow(10.0, static_cast<int>(rng.next_u64() % 12) - 8));
  auto sum = [&](const std::vector<std::vector<int>>& groups) {
    // Each group summed on its own, then the groups' limbs added: as ranks do.
    std::vector<int64_t> total(kLimbs, 0);
    for (const auto& g : groups) {
      std::vector<int64_t> acc(kLimbs, 0);
      for (int i : g) EXPECT_EQ(exact_accumulate(&x[i], acc.data(), 1), -1);
      for (int k = 0; k < kLimbs; ++k) total[k] += acc[k];
    }
    float out;
    exact_decode(total.data(), &out, 1);
    return out;
  };
  std::vector<int> all(1000);
  for (int i = 0; i < 1000; ++i) all[i] = i;
  std::vector<int> rev(all.rbegin(), all.rend());
  std::vector<std::vector<int>> thirds(3);
  for (int i = 0; i < 1000; ++i) thirds[(i * 7) % 3].push_back(i);
  const float a = sum({all}), b = sum({rev}), c = sum(thirds);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  double exact = 0;
  for (float v : x) exact += v;
  EXPECT_NEAR(a, exact, 1e-6 * std::fabs(exact) + 1e-12);
}

// exact_sum.cc computes on the values' bits; its results must be the definitions':
// round(x * 2^64) through double and __int128 (nearest, ties to even) and, decoding, the
// f32 nearest to the sum (static_cast<float> of the __int128, then 2^-64). Every exponent,
// each with the mantissas where rounding decides (ties, one below and above), both signs;
// sums past int64 and near ties of the decode's 24 bits.
TEST(ExactSum, EncodeAndDecodeAreTheRoundingsTheyDefine) {
  auto limbs_of = [](__int128 q) {
    return std::vector<int64_t>{static_cast<int64_t>(q & 0xffffffff), static_cast<int64_t>((q >> 32) & 0xffffffff),
                                static_cast<int64_t>(q >> 64)};
  };
  const uint32_t mantissas[] = {0, 1, 2, 3, 0x3fffff, 0x400000, 0x400001, 0x7ffffe, 0x7fffff, 0x155555, 0x2aaaab};
  int checked = 0;
  for (uint32_t biased = 0; biased < 127 + 31; ++biased) {
    for (uint32_t mant : mantissas) {
      for (uint32_t sign : {0u, 1u}) {
        const float v = std::bit_cast<float>(sign << 31 | biased << 23 | mant);
        const auto want = static_cast<__int128>(std::nearbyint(static_cast<double>(v) * 0x1p64));
        std::vector<int64_t> acc(kLimbs, 0);
        ASSERT_EQ(exact_accumulate(&v, acc.data(), 1), -1);
        ASSERT_EQ(acc, limbs_of(want)) << std::hexfloat << v;
        float out = 0;
        exact_decode(acc.data(), &out, 1);
        ASSERT_EQ(std::bit_cast<uint32_t>(out), std::bit_cast<uint32_t>(std::ldexp(static_cast<float>(want), -64)))
            << std::hexfloat << v;
        ++checked;
      }
    }
  }
  // Sums: 2^k + 2^(k - 24) (a tie: to even), + 1 more (above it), + 2^(k - 23) (odd: up), for
  // k up to 125, negated too; limbs left unnormalized as additions leave them.
  for (int k = 24; k < 126; ++k) {
    const __int128 base = static_cast<__int128>(1) << k, tie = static_cast<__int128>(1) << (k - 24);
    for (__int128 q : {base + tie, base + tie + 1, base + 3 * tie, base + 2 * tie + tie - 1}) {
      for (__int128 sq : {q, -q}) {
        std::vector<int64_t> acc = limbs_of(sq);
        acc[0] += int64_t{1} << 40, acc[1] -= int64_t{1} << 8;  // the same integer, other limbs
        float out = 0;
        exact_decode(acc.data(), &out, 1);
        ASSERT_EQ(std::bit_cast<uint32_t>(out), std::bit_cast<uint32_t>(std::ldexp(static_cast<float>(sq), -64))) << k;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 4000);
}

TEST(ExactSum, ValuesOutOfRangeAreNamedAndLeftOut) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1.0f, 3e9f, 2.0f, nan, -inf};
  std::vector<int64_t> acc(kLimbs * x.size(), 0);
  EXPECT_EQ(exact_accumulate(x.data(), acc.data(), static_cast<int64_t>(x.size())), 1);
  std::vector<float> out(x.size());
  exact_decode(acc.data(), out.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(out, (std::vector<float>{1.0f, 0.0f, 2.0f, 0.0f, 0.0f}));
}

TEST(ExactSum, SquaresMatchADoubleSum) {
  std::vector<float> x = {3.0f, -4.0f, 1e-3f, 12345.678f, 0.0f};
  int64_t acc[kSquareLimbs] = {};
  exact_accumulate_squares(x.data(), static_cast<int64_t>(x.size()), acc);
  double want = 0;
  for (float v : x) want += static_cast<double>(v) * v;
  EXPECT_NEAR(exact_decode_squares(acc), want, 1e-12 * want);
}

}  // namespace
}  // namespace loom::parallel
