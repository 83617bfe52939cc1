// Every layer's backward against central finite differences, all in double precision.
// L = sum(forward(x) * w) for a fixed random w; its gradient with respect to the input and
// to every parameter must match (L(x + h e_i) - L(x - h e_i)) / 2h.
// Tolerance 1e-6 relative to the largest gradient entry of each tensor: with h = 1e-5 the
// truncation error is O(h^2 L''') ~ 1e-10 and the rounding error ~ 1e-16 |L| / h ~ 1e-11,
// so 1e-6 leaves room while any real mistake in a backward shows as O(1).
#include <cblas.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "kernels/gemm/gemm.h"
#include "loom/error.h"
#include "loom/nn/gpt.h"
#include "loom/nn/layers.h"
#include "loom/nn/mlp.h"
#include "loom/rng.h"
#include "loom/threads.h"
#include "loom_testing.h"

namespace loom::nn {
namespace {

constexpr DType kF64 = DType::kF64;
constexpr double kTol = 1e-6;

void fill_randn(const Tensor& t, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  double* d = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = r.normal() * scale;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Compares analytic gradient `grad` of loss() with respect to the values in `x` against
// central differences. Checks at most `max_checks` evenly spread entries.
void expect_grad(const Tensor& x, const Tensor& grad, const std::function<double()>& loss,
                 const std::string& what, int max_checks = 400) {
  double* xd = x.data<double>();
  const double* g = grad.data<double>();
  double scale = 1e-12;
  for (int64_t i = 0; i < grad.numel(); ++i) scale = std::max(scale, std::fabs(g[i]));
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  double worst = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double h = 1e-5, x0 = xd[i];
    xd[i] = x0 + h;
    double lp = loss();
    xd[i] = x0 - h;
    double lm = loss();
    xd[i] = x0;
    worst = std::max(worst, std::fabs((lp - lm) / (2 * h) - g[i]) / scale);
  }
  EXPECT_LT(worst, kTol) << what;
}

// Checks every parameter of `ps` (gradients must already hold dL/dparam).
void expect_param_grads(const ParamSet& ps, const std::function<double()>& loss) {
  for (size_t i = 0; i < ps.infos().size(); ++i)
    expect_grad(ps.value(static_cast<int>(i)), ps.grad(static_cast<int>(i)), loss, ps.infos()[i].name);
}

void init_params(ParamSet& ps, uint64_t seed) {
  fill_randn(ps.values(), seed, 0.5);
  ps.zero_grads();
}

// For a layer with forward(x, ctx, arena) and backward(dy, ctx, arena): checks dx and, when
// given, every parameter of `ps` against finite differences of L = sum(forward(x) * w).
template <typename Ctx, typename Layer>
void check_layer(const Layer& layer, const Shape& x_shape, const Shape& y_shape, uint64_t seed,
                 const ParamSet* ps = nullptr, double x_scale = 1.0) {
  Tensor x = Tensor::zeros(x_shape, kF64), w = Tensor::zeros(y_shape, kF64);
  fill_randn(x, seed, x_scale);
  fill_randn(w, seed + 1);
  Arena arena;
  Ctx ctx;
  auto loss = [&] { return dot(layer.forward(x, ctx, arena), w); };
  loss();
  Tensor dx = layer.backward(w, ctx, arena);
  EXPECT_EQ(dx.shape(), x.shape());
  expect_grad(x, dx, loss, "dx");
  if (ps != nullptr) expect_param_grads(*ps, loss);
}

TEST(LayerGrad, Linear) {
  ParamSet ps(kF64);
  Linear lin(ps, "fc", 5, 3);
  ps.allocate();
  init_params(ps, 1);
  check_layer<LinearCtx>(lin, {2, 4, 5}, {2, 4, 3}, 2, &ps);
}

TEST(LayerGrad, LayerNorm) {
  ParamSet ps(kF64);
  LayerNorm ln(ps, "ln", 7);
  ps.allocate();
  init_params(ps, 4);
  check_layer<LayerNormCtx>(ln, {3, 7}, {3, 7}, 5, &ps, 2.0);
}

TEST(LayerGrad, Gelu) { check_layer<GeluCtx>(Gelu(), {50}, {50}, 7, nullptr, 3.0); }

TEST(LayerGrad, Embedding) {
  ParamSet ps(kF64);
  Embedding emb(ps, "wte", 6, 4);
  ps.allocate();
  init_params(ps, 9);
  Tensor ids = Tensor::zeros({2, 5}, DType::kI32);
  int32_t vals[] = {0, 5, 5, 2, 1, 3, 0, 0, 4, 5};
  std::copy(vals, vals + 10, ids.data<int32_t>());
  Tensor w = Tensor::zeros({2, 5, 4}, kF64);
  fill_randn(w, 10);
  Arena arena;
  EmbeddingCtx ctx;
  auto loss = [&] { return dot(emb.forward(ids, ctx, arena), w); };
  loss();
  emb.backward(w, ctx);
  expect_param_grads(ps, loss);
}

TEST(LayerGrad, CrossEntropy) {
  Tensor logits = Tensor::zeros({6, 9}, kF64), targets = Tensor::zeros({6}, DType::kI32);
  fill_randn(logits, 11, 2.0);
  for (int i = 0; i < 6; ++i) targets.data<int32_t>()[i] = (i * 4) % 9;
  Tensor work = Tensor::zeros({6, 9}, kF64);
  Arena arena;
  CrossEntropyCtx ctx;
  CrossEntropy ce;
  auto loss = [&] {
    work.copy_from(logits);  // backward consumes its logits; keep the originals
    return ce.forward(work, targets, ctx, arena) * 3.0;
  };
  loss();
  Tensor dlogits = ce.backward(ctx, 3.0);
  Tensor g = Tensor::zeros({6, 9}, kF64);
  g.copy_from(dlogits);
  expect_grad(logits, g, loss, "dlogits");
}

TEST(LayerGrad, CausalSelfAttention) {
  ParamSet ps(kF64);
  CausalSelfAttention attn(ps, "attn", 8, 2);
  ps.allocate();
  init_params(ps, 12);
  check_layer<AttentionCtx>(attn, {2, 5, 8}, {2, 5, 8}, 13, &ps);
}

TEST(LayerGrad, MlpAndBlock) {
  ParamSet ps(kF64);
  Mlp mlp(ps, "mlp", 6, 10);
  Block block(ps, "h.0", 8, 2);
  ps.allocate();
  init_params(ps, 15);
  check_layer<MlpCtx>(mlp, {4, 6}, {4, 6}, 16);
  check_layer<BlockCtx>(block, {2, 4, 8}, {2, 4, 8}, 18);
  // Both sub-models' parameters: rerun each backward with zeroed grads, then check all.
  ps.zero_grads();
  Arena arena;
  Tensor x1 = Tensor::zeros({4, 6}, kF64), w1 = Tensor::zeros({4, 6}, kF64);
  Tensor x2 = Tensor::zeros({2, 4, 8}, kF64), w2 = Tensor::zeros({2, 4, 8}, kF64);
  fill_randn(x1, 16);
  fill_randn(w1, 17);
  fill_randn(x2, 18);
  fill_randn(w2, 19);
  MlpCtx c1;
  BlockCtx c2;
  auto loss = [&] {
    return dot(mlp.forward(x1, c1, arena), w1) + dot(block.forward(x2, c2, arena), w2);
  };
  loss();
  mlp.backward(w1, c1, arena);
  block.backward(w2, c2, arena);
  expect_param_grads(ps, loss);
}

TEST(ModelGrad, GptEndToEnd) {
  GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 8, .seq_len = 6, .vocab_size = 11};
  Gpt gpt(cfg, kF64);
  gpt.init(20);
  const auto batch = testing::random_tokens(2, 5, 11, 21);
  const Tensor &tokens = batch.first, &targets = batch.second;  // lambdas capture these (not bindings: clang 14)
  GptCtx ctx;
  auto loss = [&] { return gpt.forward(tokens, targets, ctx); };
  double l0 = loss();
  EXPECT_NEAR(l0, std::log(11.0), 0.1);  // small init: near-uniform predictions
  std::vector<std::pair<int, BlockPhase>> events;
  // Hooks are a list: each is called, in the order added, until removed.
  std::vector<std::pair<int, BlockPhase>> second;
  const BlockHooks::Id first_id = gpt.hooks().add([&](int b, BlockPhase p) { events.emplace_back(b, p); });
  const BlockHooks::Id second_id = gpt.hooks().add([&](int b, BlockPhase p) {
    EXPECT_EQ(events.size(), second.size() + 1);  // the first hook ran first
    second.emplace_back(b, p);
  });
  loss();
  gpt.params().zero_grads();
  gpt.backward(ctx, 1.0);
  gpt.hooks().remove(first_id);
  gpt.hooks().remove(second_id);
  EXPECT_TRUE(gpt.hooks().empty());
  EXPECT_EQ(second, events);
  using P = BlockPhase;
  const std::vector<std::pair<int, BlockPhase>> want_events = {
      {-1, P::kForward}, {0, P::kForward}, {0, P::kForwardDone}, {1, P::kForward}, {1, P::kForwardDone},
      {-1, P::kForwardDone}, {-1, P::kBackward}, {1, P::kBackward}, {1, P::kBackwardDone}, {0, P::kBackward},
      {0, P::kBackwardDone}, {-1, P::kBackwardDone}};
  EXPECT_EQ(events, want_events);
  const std::vector<int64_t> offsets = gpt.block_offsets();
  ASSERT_EQ(offsets.size(), 3u);
  EXPECT_EQ(offsets[0], gpt.params().infos()[gpt.params().find("transformer.h.0.ln_1.weight")].offset);
  EXPECT_EQ(offsets[2], gpt.params().infos()[gpt.params().find("transformer.ln_f.weight")].offset);
  expect_param_grads(gpt.params(), loss);
  // Last-position logits equal the full forward's last row.
  Tensor full = gpt.forward_logits(tokens, ctx, false);
  std::vector<double> want(full.data<double>() + 4 * 11, full.data<double>() + 5 * 11);
  Tensor last = gpt.forward_logits(tokens, ctx, true);
  EXPECT_EQ(last.shape(), (Shape{2, 1, 11}));
  for (int j = 0; j < 11; ++j) EXPECT_DOUBLE_EQ(last.data<double>()[j], want[j]);
}

TEST(ModelGrad, MlpClassifierEndToEnd) {
  MlpClassifier mlp({.inputs = 12, .hidden = 7, .n_hidden = 2, .classes = 4}, kF64);
  mlp.init(22);
  Tensor x = Tensor::zeros({5, 12}, kF64), y = Tensor::zeros({5}, DType::kI32);
  fill_randn(x, 23);
  for (int i = 0; i < 5; ++i) y.data<int32_t>()[i] = i % 4;
  MlpClassifierCtx ctx;
  auto loss = [&] { return mlp.forward(x, y, ctx); };
  loss();
  mlp.backward(ctx, 1.0);
  expect_param_grads(mlp.params(), loss);
}

TEST(Gpt, InitFollowsGpt2) {
  GptConfig cfg{.n_layer = 8, .n_head = 4, .d_model = 64, .seq_len = 32, .vocab_size = 100};
  Gpt gpt(cfg);
  gpt.init(1);
  auto stddev = [&](const std::string& name) {
    Tensor t = gpt.params().value(gpt.params().find(name));
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += double(t.data<float>()[i]) * t.data<float>()[i];
    return std::sqrt(s / t.numel());
  };
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.mlp.c_proj.weight"), 0.02 / 4.0, 0.0003);
  EXPECT_EQ(stddev("transformer.h.0.attn.c_attn.bias"), 0.0);
  EXPECT_EQ(gpt.params().value(gpt.params().find("transformer.ln_f.weight")).data<float>()[3], 1.0f);
  EXPECT_EQ(gpt.params().infos()[0].name, "transformer.wte.weight");
  EXPECT_EQ(gpt.params().infos()[0].shape, (Shape{100, 64}));
  EXPECT_EQ(gpt.params().value(gpt.params().find("transformer.h.0.attn.c_attn.weight")).shape(),
            (Shape{64, 192}));
}

}  // namespace
}  // namespace loom::nn

namespace loom::nn {
namespace {

// One GPT training step's loss and gradients, as bits.
std::pair<double, std::vector<float>> gpt_step_bits(int threads) {
  GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab_size = 97};
  set_compute_threads(threads);
  Gpt gpt(cfg);
  gpt.init(5);
  auto [x, y] = testing::random_tokens(4, 32, 97, 6);
  GptCtx ctx;
  double loss = gpt.forward(x, y, ctx);
  gpt.backward(ctx, 1.0);
  const float* g = gpt.params().grads().data<float>();
  set_compute_threads(1);
  return std::make_pair(loss, std::vector<float>(g, g + gpt.params().numel()));
}

bool same_bits(const std::pair<double, std::vector<float>>& a,
               const std::pair<double, std::vector<float>>& b) {
  return a.first == b.first && a.second.size() == b.second.size() &&
         std::memcmp(a.second.data(), b.second.data(), a.second.size() * sizeof(float)) == 0;
}

// One GPT training step's loss and gradients are bitwise the same with 1, 2 and 3 compute
// threads (docs/numerics.md, Determinism), whatever core type OpenBLAS detects: ctest runs
// this suite again under each OPENBLAS_CORETYPE (src/nn/CMakeLists.txt). Also the test
// where ThreadSanitizer sees Loom's parallel regions (the suite otherwise pins one thread
// per test).
TEST(Determinism, GptGradientsDoNotDependOnThreadCount) {
  const auto one = gpt_step_bits(1);
  EXPECT_TRUE(same_bits(one, gpt_step_bits(2)));
  EXPECT_TRUE(same_bits(one, gpt_step_bits(3)));
}

// Under ctest's nn_determinism_CORE runs, OpenBLAS really runs the core type asked for
// (so those runs prove what they claim on any CPU that can run it).
TEST(Determinism, OpenBlasRunsTheCoreTypeAskedFor) {
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked == nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is not set";
  EXPECT_EQ(0, strcasecmp(asked, openblas_get_corename()))
      << "asked for " << asked << ", OpenBLAS runs " << openblas_get_corename();
}

// Every GEMM path this CPU has (AVX-512, AVX2, generic) gives the same step, bit for bit:
// the GEMM's order of arithmetic is fixed by design, not by the CPU (kernels/gemm/gemm.h).
TEST(Determinism, GptGradientsDoNotDependOnGemmPath) {
  using kernels::GemmPath;
  const auto paths = kernels::gemm_supported_paths();
  ASSERT_GE(paths.size(), 1u);
  kernels::set_gemm_path(paths.front());
  const auto widest = gpt_step_bits(2);
  for (GemmPath path : paths) {
    kernels::set_gemm_path(path);
    EXPECT_TRUE(same_bits(widest, gpt_step_bits(2))) << kernels::gemm_path_name(path);
  }
  kernels::set_gemm_path(GemmPath::kAuto);
}

}  // namespace
}  // namespace loom::nn

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
