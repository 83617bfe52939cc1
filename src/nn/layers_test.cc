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
#include "loom/core/error.h"
#include "loom/nn/gpt.h"
#include "loom/nn/layers.h"
#include "loom/nn/mlp.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
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
// (so those runs prove what they claim on any CPU that can run it). A CPU without the
// core's instructions cannot: OpenBLAS then falls back (Cooperlake to Haswell on an AVX2
// CPU) or names a core it could not run, so the check is skipped there, saying why.
TEST(Determinism, OpenBlasRunsTheCoreTypeAskedFor) {
  using kernels::GemmPath;
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked == nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is not set";
  const bool needs_bf16 = strcasecmp(asked, "Cooperlake") == 0, needs_avx512 = strcasecmp(asked, "SkylakeX") == 0;
  if ((needs_bf16 && !kernels::gemm_path_supported(GemmPath::kAvx512Bf16)) ||
      (needs_avx512 && !kernels::gemm_path_supported(GemmPath::kAvx512)))
    GTEST_SKIP() << "this CPU has no " << (needs_bf16 ? "AVX512_BF16" : "AVX-512") << ", which OpenBLAS's " << asked
                 << " kernels need";
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
