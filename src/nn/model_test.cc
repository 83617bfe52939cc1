// nn::Model as every parallelism sees it: the whole forward and backward against the same
// in pieces (what a pipeline stage runs), through the interface alone, for both models; the
// hooks each sees; a classifier's evaluation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "loom/nn/gpt.h"
#include "loom/nn/mlp.h"
#include "loom/nn/model.h"
#include "loom/core/rng.h"
#include "loom_testing.h"

namespace loom::nn {
namespace {

struct Pass {
  double loss = 0;
  std::vector<float> grads;
  std::vector<std::pair<int, BlockPhase>> events;
};

std::vector<float> grads_of(const Model& m) {
  const Tensor g = m.params().grads();
  return {g.data<float>(), g.data<float>() + g.numel()};
}

Pass whole(Model& m, const Tensor& in, const Tensor& targets, double scale) {
  Pass r;
  const BlockHooks::Id id = m.hooks().add([&](int b, BlockPhase p) { r.events.emplace_back(b, p); });
  std::unique_ptr<ModelCtx> ctx = m.make_ctx();
  m.params().zero_grads();
  r.loss = m.forward(in, targets, *ctx);
  m.backward(*ctx, scale);
  m.hooks().remove(id);
  r.grads = grads_of(m);
  return r;
}

// Blocks [0, cut) and [cut, n) as two pipeline stages would run them, in one process.
Pass in_pieces(Model& m, const Tensor& in, const Tensor& targets, double scale, int64_t cut, int64_t t) {
  Pass r;
  const BlockHooks::Id id = m.hooks().add([&](int b, BlockPhase p) { r.events.emplace_back(b, p); });
  std::unique_ptr<ModelCtx> ctx = m.make_ctx();
  m.params().zero_grads();
  const int64_t n = m.n_blocks();
  m.begin(*ctx, in.dim(0), t);
  const Tensor mid = m.forward_stage(0, cut, m.embed(in, *ctx), *ctx);
  EXPECT_EQ(mid.shape(), m.activation_shape(in.dim(0), t));
  r.loss = m.head(m.forward_stage(cut, n, mid, *ctx), targets, *ctx);
  const Tensor dmid = m.backward_stage(cut, n, m.backward_head(*ctx, scale), *ctx);
  m.backward_embed(m.backward_stage(0, cut, dmid, *ctx), *ctx);
  m.hooks().remove(id);
  r.grads = grads_of(m);
  return r;
}

void expect_same_bits(const Pass& a, const Pass& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)), 0);
}

// Every block's (b, kBackwardDone) comes after its (b, kBackward), each block once per pass.
void expect_blocks_bracketed(const Pass& r, int64_t n) {
  for (int64_t b = 0; b < n; ++b) {
    int forward = 0, backward = 0;
    for (size_t i = 0; i < r.events.size(); ++i) {
      if (r.events[i].first != b) continue;
      if (r.events[i].second == BlockPhase::kForward) {
        ++forward;
        ASSERT_LT(i + 1, r.events.size());
        EXPECT_EQ(r.events[i + 1], std::make_pair(static_cast<int>(b), BlockPhase::kForwardDone));
      }
      if (r.events[i].second == BlockPhase::kBackward) {
        ++backward;
        ASSERT_LT(i + 1, r.events.size());
        EXPECT_EQ(r.events[i + 1], std::make_pair(static_cast<int>(b), BlockPhase::kBackwardDone));
      }
    }
    EXPECT_EQ(forward, 1) << "block " << b;
    EXPECT_EQ(backward, 1) << "block " << b;
  }
}

TEST(Model, GptInPiecesGivesTheWholeModelsBits) {
  Gpt gpt({.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 23});
  gpt.init(7);
  const auto [tokens, targets] = testing::random_tokens(2, 8, 23, 3);
  Model& m = gpt;
  EXPECT_EQ(m.n_blocks(), 3);
  EXPECT_EQ(m.shape().kind, "gpt");
  const Pass a = whole(m, tokens, targets, 0.5);
  const Pass b = in_pieces(m, tokens, targets, 0.5, 1, 8);
  expect_same_bits(a, b);
  expect_blocks_bracketed(a, 3);
  expect_blocks_bracketed(b, 3);
}

TEST(Model, MlpInPiecesGivesTheWholeModelsBits) {
  MlpClassifier mlp({.inputs = 12, .hidden = 10, .n_hidden = 3, .classes = 5});
  mlp.init(11);
  Tensor x = Tensor::zeros({4, 12}, DType::kF32), labels = Tensor::zeros({4}, DType::kI32);
  Rng r(5);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(r.normal());
  for (int64_t i = 0; i < 4; ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(r.below(5));
  Model& m = mlp;
  EXPECT_EQ(m.n_blocks(), 4);
  EXPECT_EQ(m.block_offsets().size(), 5U);
  EXPECT_EQ(m.shape().kind, "mlp");
  const Pass a = whole(m, x, labels, 2.0);
  for (int64_t cut : {1, 2, 3}) {
    const Pass b = in_pieces(m, x, labels, 2.0, cut, 1);
    expect_same_bits(a, b);
    expect_blocks_bracketed(b, 4);
  }
  expect_blocks_bracketed(a, 4);
  // The whole pass brackets the blocks with block -1 (its rest).
  ASSERT_FALSE(a.events.empty());
  EXPECT_EQ(a.events.front(), std::make_pair(-1, BlockPhase::kForward));
  EXPECT_EQ(a.events.back(), std::make_pair(-1, BlockPhase::kBackwardDone));

  // evaluate: the forward's loss, and the rows whose largest logit is the label.
  MlpClassifierCtx ctx;
  const EvalSums e = m.evaluate(x, labels, ctx);
  EXPECT_EQ(e.loss, a.loss);
  int64_t right = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const float* row = ctx.logits.data<float>() + i * 5;
    right += std::max_element(row, row + 5) - row == labels.data<int32_t>()[i] ? 1 : 0;
  }
  EXPECT_EQ(e.correct, right);
  GptCtx wrong_kind;
  EXPECT_DEATH(m.forward(x, labels, wrong_kind), "");  // a context another model made
}

TEST(Model, HooksAreAListCalledInTheOrderAdded) {
  BlockHooks hooks;
  std::vector<int> calls;
  const BlockHooks::Id a = hooks.add([&](int b, BlockPhase) { calls.push_back(10 + b); });
  hooks.add([&](int b, BlockPhase) { calls.push_back(20 + b); });
  hooks(1, BlockPhase::kForward);
  hooks.remove(a);
  hooks.remove(12345);  // unknown: ignored
  hooks(2, BlockPhase::kForward);
  EXPECT_EQ(calls, (std::vector<int>{11, 21, 22}));
  EXPECT_FALSE(hooks.empty());
}

}  // namespace
}  // namespace loom::nn
