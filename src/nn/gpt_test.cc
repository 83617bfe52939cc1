// The GPT as a whole: deferred weight gradients and stage parts equal the whole model,
// recompute keeps the bits, the activation-memory formula predicts the arena to the byte,
// incremental decoding equals the full forward, and bad shapes name their field.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "loom/core/error.h"
#include "loom/nn/gpt.h"
#include "loom/nn/layers.h"
#include "loom/nn/step_breakdown.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "loom_testing.h"

// Zero-bubble pipelines split backward: input gradients first, the linear layers' and the
// head's weight gradients later. The two halves add exactly what one backward adds, and a
// stage that holds only some blocks starts from the weights the whole model draws.
namespace loom::nn {
namespace {
TEST(Gpt, DeferredWeightGradientsAndPartsEqualTheWhole) {
  GptConfig cfg{.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 13};
  Gpt gpt(cfg);
  gpt.init(5);
  auto [tokens, targets] = testing::random_tokens(2, 8, 13, 6);
  GptCtx ctx;
  gpt.forward(tokens, targets, ctx);
  gpt.backward(ctx, 0.5);
  const std::vector<float> whole(gpt.params().grads().data<float>(), gpt.params().grads().data<float>() + gpt.params().numel());

  gpt.params().zero_grads();
  gpt.forward(tokens, targets, ctx);
  Tensor dx = gpt.backward_stage(0, cfg.n_layer, gpt.backward_head(ctx, 0.5, /*defer_weights=*/true), ctx, true);
  gpt.backward_weights(0, cfg.n_layer, /*head=*/true, ctx);
  gpt.backward_embed(dx, ctx);  // after the head's share of wte, as one backward adds them
  const float* split = gpt.params().grads().data<float>();
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), split));

  // The middle block alone, initialized from the same seed: the whole model's weights.
  Gpt part(cfg, DType::kF32, {.blocks = {1}, .all_blocks = false, .embeddings = false, .head = false});
  part.init(5);
  ASSERT_EQ(part.params().infos().size(), 12u);
  for (const ParamInfo& p : part.params().infos()) {
    Tensor mine = part.params().value(part.params().find(p.name)), theirs = gpt.params().value(gpt.params().find(p.name));
    EXPECT_EQ(std::memcmp(mine.raw(), theirs.raw(), mine.nbytes()), 0) << p.name;
  }
}
}  // namespace
}  // namespace loom::nn

// Activation recompute trades memory for a second forward: the gradients do not change by
// a bit. Full keeps less per micro-batch than none; selective keeps what none keeps, as
// the blocked attention keeps no probabilities to drop (it recomputes them in every mode).
namespace loom::nn {
namespace {
TEST(Gpt, RecomputeKeepsTheBitsAndLessMemory) {
  GptConfig cfg{.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 32, .vocab_size = 13};
  auto [tokens, targets] = testing::random_tokens(2, 32, 13, 8);
  std::vector<float> want;
  size_t kept_before = 0;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    Gpt gpt(cfg);
    gpt.init(9);
    gpt.set_recompute(mode);
    GptCtx ctx;
    const double loss = gpt.forward(tokens, targets, ctx);
    const size_t kept = ctx.arena.peak_bytes();  // what forward leaves for backward
    gpt.backward(ctx, 1.0);
    const float* g = gpt.params().grads().data<float>();
    std::vector<float> got(g, g + gpt.params().numel());
    if (mode == Recompute::kNone) {
      want = got;
      EXPECT_GT(loss, 0);
    } else {
      EXPECT_TRUE(got == want) << "recompute mode " << static_cast<int>(mode) << " changed the gradients";
      if (mode == Recompute::kSelective) {
        EXPECT_EQ(kept, kept_before) << "selective";
      } else {
        EXPECT_LT(kept, kept_before) << "full";
      }
    }
    kept_before = kept;
  }
  EXPECT_THROW(recompute_named("some"), InputError);
}

// The memory plan (docs/parallelism.md, "Memory") predicts the arena and workspace of a
// micro-batch to the byte: every allocation forward and backward make is in the formula.
TEST(Gpt, ActivationBytesPredictTheArenaExactly) {
  const GptConfig shapes[] = {{.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 32, .vocab_size = 13},
                              {.n_layer = 1, .n_head = 4, .d_model = 24, .seq_len = 9, .vocab_size = 50},
                              {.n_layer = 2, .n_head = 1, .d_model = 5, .seq_len = 7, .vocab_size = 3}};
  for (const GptConfig& cfg : shapes)
    for (int64_t b : {1, 3})
      for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        const int64_t t = cfg.seq_len - 1;
        auto [tokens, targets] = testing::random_tokens(b, t, cfg.vocab_size, 4);
        Gpt gpt(cfg);
        gpt.init(3);
        gpt.set_recompute(mode);
        GptCtx ctx;
        gpt.forward(tokens, targets, ctx);
        const ActivationBytes fwd = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, /*with_backward=*/false);
        const std::string what = cat("d_model ", cfg.d_model, ", b ", b, ", recompute ", static_cast<int>(mode));
        EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), fwd.arena) << what;
        gpt.backward(ctx, 1.0);
        const ActivationBytes both = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode);
        EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), both.arena) << what;
        EXPECT_EQ(static_cast<double>(gpt.recompute_peak_bytes()), both.workspace) << what;
        EXPECT_EQ(static_cast<double>(gpt.params().numel()), gpt_counts(cfg).total()) << what;
      }
}

// A tensor-parallel piece's arena and parameters: the same formulas with tp. The seam here
// sums nothing (one piece alone computes wrong values, with the right memory).
TEST(Gpt, ActivationBytesPredictATensorParallelPiece) {
  struct Alone : Seam {  // a piece's shapes and allocations without its peers
    void sum(const Tensor&) override {}
    void max(const Tensor&) override {}
    void all_gather(const Tensor& local, const Tensor& whole) override { whole.zero(), local.zero(); }
    void reduce_scatter(const Tensor&, const Tensor& local) override { local.zero(); }
  };
  const GptConfig shapes[] = {{.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 32, .vocab_size = 14},
                              {.n_layer = 1, .n_head = 4, .d_model = 24, .seq_len = 9, .vocab_size = 52}};
  for (const GptConfig& cfg : shapes)
    for (int tp : {2, 4})
      for (bool sequence : {false, true}) {
        if (cfg.n_head % tp != 0) continue;
        for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          const int64_t b = 4, t = cfg.seq_len - 1;
          auto [tokens, targets] = testing::random_tokens(b, t, cfg.vocab_size, 4);
          Alone alone;
          Gpt gpt(cfg, DType::kF32, {}, {.index = 1, .parts = tp, .seam = &alone, .sequence = sequence});
          gpt.init(3);
          gpt.set_recompute(mode);
          GptCtx ctx;
          gpt.forward(tokens, targets, ctx);
          const std::string what = cat("d_model ", cfg.d_model, ", tp ", tp, ", sequence parallel ", sequence,
                                       ", recompute ", static_cast<int>(mode));
          const ActivationBytes fwd =
              gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, /*with_backward=*/false, tp, sequence);
          EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), fwd.arena) << what;
          EXPECT_EQ(static_cast<double>(alone.staging().peak_bytes()), fwd.staging) << what;
          gpt.backward(ctx, 1.0);
          const ActivationBytes both = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, true, tp, sequence);
          EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), both.arena) << what;
          EXPECT_EQ(static_cast<double>(gpt.recompute_peak_bytes()), both.workspace) << what;
          EXPECT_EQ(static_cast<double>(alone.staging().peak_bytes()), both.staging) << what;
          EXPECT_EQ(static_cast<double>(gpt.params().numel()), gpt_counts(cfg, tp).total()) << what;
          if (sequence) {  // what sequence parallelism saves
            const ActivationBytes whole = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, true, tp, false);
            EXPECT_LT(both.arena, whole.arena) << what;
          }
        }
      }
}

// Incremental decoding: a prefill of 4 tokens, then one token at a time, gives at every
// position the logits the full forward gives there (to rounding: the attention adds in
// another order); and a cache restarted on the last half window (what `loom sample` does
// past the window) gives the full forward's logits over exactly those tokens.
template <typename T>
void expect_decoding_equals_the_full_forward(double tolerance) {
  const GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 12, .vocab_size = 20};
  Gpt gpt(cfg, sizeof(T) == 8 ? DType::kF64 : DType::kF32);
  gpt.init(5);
  auto [tokens, unused] = testing::random_tokens(1, cfg.seq_len, cfg.vocab_size, 9);
  const int32_t* ids = tokens.data<int32_t>();
  GptCtx ctx;
  const Tensor full = gpt.forward_logits(tokens, ctx, /*last_only=*/false);  // (1, T, V)
  auto expect_row = [&](const Tensor& got, const T* want, const std::string& what) {
    double scale = 0, worst = 0;
    for (int64_t j = 0; j < cfg.vocab_size; ++j) {
      scale = std::max(scale, std::abs(static_cast<double>(want[j])));
      worst = std::max(worst, std::abs(static_cast<double>(got.data<T>()[j]) - static_cast<double>(want[j])));
    }
    EXPECT_LE(worst, tolerance * scale) << what;
  };
  KvCache cache = gpt.make_cache();
  Arena arena;
  const int64_t prefill = 4;
  expect_row(gpt.decode({ids, static_cast<size_t>(prefill)}, cache, arena), full.data<T>() + (prefill - 1) * cfg.vocab_size,
             "after the prefill");
  for (int64_t i = prefill; i < cfg.seq_len; ++i)
    expect_row(gpt.decode({ids + i, 1}, cache, arena), full.data<T>() + i * cfg.vocab_size, cat("position ", i));
  EXPECT_EQ(cache.length, cache.capacity());
  cache.length = 0;  // past the window: start again from the last half
  const int64_t half = cfg.seq_len / 2;
  Tensor tail = Tensor::zeros({1, half}, DType::kI32);
  std::copy_n(ids + cfg.seq_len - half, half, tail.data<int32_t>());
  GptCtx tail_ctx;
  const Tensor want = gpt.forward_logits(tail, tail_ctx, /*last_only=*/true);
  expect_row(gpt.decode({ids + cfg.seq_len - half, static_cast<size_t>(half)}, cache, arena), want.data<T>(), "restarted");
}

TEST(Gpt, DecodingWithACacheEqualsTheFullForward) { expect_decoding_equals_the_full_forward<double>(1e-12); }
TEST(Gpt, DecodingWithACacheInFloat32WithinTheStatedTolerance) { expect_decoding_equals_the_full_forward<float>(1e-5); }

// Continuous batching's foundation: sequences decoded together (joining with a prefill of
// their own length while the others decode one token) get the same bits as each alone.
TEST(Gpt, DecodingABatchGivesEachSequenceTheBitsItGetsAlone) {
  const int threads = compute_threads();
  set_compute_threads(2);
  const GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab_size = 20};
  Gpt gpt(cfg, DType::kF32);
  gpt.init(6);
  const Tensor tokens = testing::random_tokens(3, cfg.seq_len, cfg.vocab_size, 10).first;
  auto seq = [&](int64_t s) { return std::span<const int32_t>(tokens.data<int32_t>() + s * cfg.seq_len, cfg.seq_len); };
  // Sequence s's calls: a prefill of prefill[s] tokens at step join[s], then one token a step.
  const int64_t prefill[] = {3, 5, 2}, join[] = {0, 0, 2}, steps = 8;
  auto call = [&](int64_t s, int64_t step) -> std::span<const int32_t> {
    if (step < join[s]) return {};
    if (step == join[s]) return seq(s).first(static_cast<size_t>(prefill[s]));
    return seq(s).subspan(static_cast<size_t>(prefill[s] + step - join[s] - 1), 1);
  };
  std::vector<std::vector<float>> alone(3);
  Arena arena;
  for (int64_t s = 0; s < 3; ++s) {
    KvCache cache = gpt.make_cache();
    for (int64_t step = join[s]; step < steps; ++step) {
      const Tensor logits = gpt.decode(call(s, step), cache, arena);
      alone[s].insert(alone[s].end(), logits.data<float>(), logits.data<float>() + cfg.vocab_size);
    }
  }
  std::vector<KvCache> caches(3);
  for (auto& c : caches) c = gpt.make_cache();
  std::vector<std::vector<float>> together(3);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::span<const int32_t>> batch;
    std::vector<KvCache*> batch_caches;
    std::vector<int64_t> who;
    for (int64_t s = 0; s < 3; ++s)
      if (step >= join[s]) batch.push_back(call(s, step)), batch_caches.push_back(&caches[s]), who.push_back(s);
    const Tensor logits = gpt.decode_batch(batch, batch_caches, arena);  // (sequences, V)
    for (size_t i = 0; i < who.size(); ++i)
      together[who[i]].insert(together[who[i]].end(), logits.data<float>() + i * cfg.vocab_size,
                              logits.data<float>() + (i + 1) * cfg.vocab_size);
  }
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
  set_compute_threads(threads);
}

TEST(Gpt, ConfigProblemsNameTheField) {
  EXPECT_EQ(gpt_config_problem({}), "");
  EXPECT_EQ(gpt_config_problem({.d_model = 0}).substr(0, 12), "d_model = 0:");
  EXPECT_EQ(gpt_config_problem({.n_head = 3}).substr(0, 15), "d_model = 256: ");
  EXPECT_EQ(gpt_config_problem({.seq_len = int64_t{1} << 40}).substr(0, 8), "seq_len ");
  EXPECT_EQ(gpt_config_problem({.n_layer = 1 << 20, .d_model = 1 << 20}).substr(0, 33), "d_model = 1048576 with n_layer = ");
}
}  // namespace
}  // namespace loom::nn

// `loom bench train --breakdown` (loom/nn/step_breakdown.h): a scope inside another is charged
// its own time and pauses the outer one's, so the parts never add up to more than the wall
// time; nothing is kept while recording is off; and a GPT step charges every part it runs.
namespace loom::nn {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
void spin(double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < seconds) {
  }
}

TEST(StepBreakdown, AScopeInsideAnotherIsChargedItsOwnTime) {
  {
    const StepPartScope unrecorded(StepPart::kLinearForward);
    spin(0.002);
  }
  record_step_parts(true);
  EXPECT_EQ(take_step_parts()[0], 0.0);  // nothing from before recording began
  const auto t0 = std::chrono::steady_clock::now();
  {
    const StepPartScope outer(StepPart::kLinearForward);
    spin(0.02);
    {
      const StepPartScope inner(StepPart::kNormForward);
      spin(0.02);
      const StepPartScope same(StepPart::kNormForward);  // nested in its own part: counted once
      spin(0.01);
    }
    spin(0.01);
  }
  const double wall = seconds_since(t0);
  const std::array<double, kStepParts> s = take_step_parts();
  const double outer = s[static_cast<int>(StepPart::kLinearForward)], inner = s[static_cast<int>(StepPart::kNormForward)];
  EXPECT_GE(outer, 0.03);
  EXPECT_GE(inner, 0.03);
  EXPECT_LE(outer + inner, wall);
  // The process's CPU time over the same spans: this thread spinning, so about the wall time
  // (less where the machine ran something else: a tenth is a loaded machine's floor), never
  // more than every thread's.
  const std::array<double, kStepParts> cpu = take_step_parts_cpu();
  for (const int part : {static_cast<int>(StepPart::kLinearForward), static_cast<int>(StepPart::kNormForward)}) {
    EXPECT_GE(cpu[static_cast<size_t>(part)], 0.1 * s[static_cast<size_t>(part)]) << part;
    EXPECT_LE(cpu[static_cast<size_t>(part)], s[static_cast<size_t>(part)] * omp_get_max_threads() + 0.01) << part;
  }
  EXPECT_EQ(take_step_parts_cpu()[static_cast<int>(StepPart::kLinearForward)], 0.0);  // taken, so zeroed
  for (int i = 0; i < kStepParts; ++i) {
    const bool opened = i == static_cast<int>(StepPart::kLinearForward) || i == static_cast<int>(StepPart::kNormForward);
    EXPECT_EQ(s[static_cast<size_t>(i)] > 0.0, opened) << step_part_name(static_cast<StepPart>(i));
  }
  EXPECT_EQ(take_step_parts()[static_cast<int>(StepPart::kLinearForward)], 0.0);  // taken, so zeroed
  record_step_parts(false);
  {
    const StepPartScope off(StepPart::kOptimizer);
    spin(0.002);
  }
  EXPECT_EQ(take_step_parts()[static_cast<int>(StepPart::kOptimizer)], 0.0);
}

// A traced step's spans (parallel::trace_step_parts): each scope as it closes, inner ones
// first, with its own start and end, whether or not parts are being recorded.
TEST(StepBreakdown, AnObserverSeesEachScopeAsItCloses) {
  struct Seen {
    StepPart part;
    std::chrono::steady_clock::time_point begin, end;
  };
  std::vector<Seen> seen;
  observe_step_parts([&](StepPart part, auto begin, auto end) { seen.push_back({part, begin, end}); });
  {
    const StepPartScope outer(StepPart::kAttentionBackward);
    spin(0.002);
    const StepPartScope inner(StepPart::kLinearDataGrad);
    spin(0.002);
  }
  observe_step_parts(nullptr);
  { const StepPartScope unseen(StepPart::kOptimizer); }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].part, StepPart::kLinearDataGrad);
  EXPECT_EQ(seen[1].part, StepPart::kAttentionBackward);
  EXPECT_LE(seen[1].begin, seen[0].begin);
  EXPECT_LE(seen[0].end, seen[1].end);
  EXPECT_GE(std::chrono::duration<double>(seen[1].end - seen[1].begin).count(), 0.004);
  EXPECT_EQ(take_step_parts()[static_cast<int>(StepPart::kAttentionBackward)], 0.0);  // not recorded
}

TEST(StepBreakdown, AGptStepChargesEveryPartItRuns) {
  const GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab_size = 20};
  for (const DType precision : {DType::kF32, DType::kBF16}) {
    Gpt gpt(cfg);
    gpt.init(3);
    gpt.set_precision(precision);
    auto [tokens, targets] = testing::random_tokens(2, 16, 20, 4);
    GptCtx ctx;
    record_step_parts(true);
    const auto t0 = std::chrono::steady_clock::now();
    gpt.forward(tokens, targets, ctx);
    gpt.backward(ctx, 1.0);
    const double wall = seconds_since(t0);
    const std::array<double, kStepParts> s = take_step_parts();
    record_step_parts(false);
    double sum = 0;
    for (int i = 0; i < kStepParts; ++i) {
      const auto part = static_cast<StepPart>(i);
      sum += s[static_cast<size_t>(i)];
      // The GELU runs fused into c_fc's products, but on its own in f32's backward; the
      // optimizer is the caller's.
      const bool runs = part != StepPart::kGeluForward && part != StepPart::kOptimizer &&
                        (part != StepPart::kGeluBackward || precision == DType::kF32);
      EXPECT_EQ(s[static_cast<size_t>(i)] > 0.0, runs) << step_part_name(part) << " in " << dtype_name(precision);
    }
    EXPECT_LE(sum, wall);
  }
}

}  // namespace
}  // namespace loom::nn
