#include "loom/optim/optim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace loom::optim {
namespace {

TEST(Schedule, WarmupThenCosineToMin) {
  ScheduleConfig s{.lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 14, .decay = "cosine"};
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 1.0);
  EXPECT_NEAR(lr_at(s, 13), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(s, 100), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(s, 8), 0.1 + 0.45 * (1 + std::cos(M_PI * 4.0 / 9.0)), 1e-12);
  s.decay = "linear";
  EXPECT_NEAR(lr_at(s, 13), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(s, 8), 1.0 - 0.9 * 4.0 / 9.0, 1e-12);
  s.decay = "constant";
  EXPECT_DOUBLE_EQ(lr_at(s, 9), 1.0);
}

TEST(Clip, ScalesToMaxNorm) {
  ParamSet ps;
  ps.add("w", {2}, ParamKind::kWeight);
  ps.add("b", {1}, ParamKind::kBias);
  ps.allocate();
  float* g = ps.grads().data<float>();
  g[0] = 3;
  g[1] = 4;
  g[2] = 12;  // norm 13
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 0.0), 13.0);
  EXPECT_EQ(g[0], 3.0f);  // 0 disables clipping
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.3), 13.0);
  EXPECT_NEAR(g[2], 12 * 1.3 / 13, 1e-6);
  EXPECT_NEAR(clip_grad_norm(ps, 100), 1.3, 1e-6);
}

TEST(AdamW, DecaysOnlyWeightsByDefault) {
  ParamSet ps;
  ps.add("w", {1}, ParamKind::kWeight);
  ps.add("b", {1}, ParamKind::kBias);
  ps.add("e", {1}, ParamKind::kEmbedding);
  ps.allocate();
  for (int i = 0; i < 3; ++i) ps.values().data<float>()[i] = 1.0f;  // zero gradients
  auto opt = make_optimizer({.kind = "adamw", .weight_decay = 0.5}, ps);
  opt->step(0.1);
  EXPECT_FLOAT_EQ(ps.values().data<float>()[0], 0.95f);
  EXPECT_FLOAT_EQ(ps.values().data<float>()[1], 1.0f);
  EXPECT_FLOAT_EQ(ps.values().data<float>()[2], 1.0f);
  EXPECT_EQ(opt->steps(), 1);
  EXPECT_EQ(opt->state().size(), 2u);
  OptimizerConfig all{.kind = "adamw", .weight_decay = 0.5,
                      .decay = {.decay_embeddings = true, .decay_norms_and_biases = true}};
  auto opt2 = make_optimizer(all, ps);
  opt2->step(0.1);
  EXPECT_FLOAT_EQ(ps.values().data<float>()[1], 0.95f);
  EXPECT_FLOAT_EQ(ps.values().data<float>()[2], 0.95f);
}

TEST(Optimizer, UnknownKindIsInputError) {
  ParamSet ps;
  ps.add("w", {1}, ParamKind::kWeight);
  ps.allocate();
  EXPECT_THROW(make_optimizer({.kind = "lamb"}, ps), InputError);
}

TEST(Sgd, MomentumMinimizesQuadratic) {
  ParamSet ps;
  ps.add("w", {1}, ParamKind::kWeight);
  ps.allocate();
  float* w = ps.values().data<float>();
  float* g = ps.grads().data<float>();
  w[0] = 5;
  auto opt = make_optimizer({.kind = "sgd", .weight_decay = 0.0, .momentum = 0.5}, ps);
  for (int i = 0; i < 100; ++i) {
    g[0] = 2 * w[0];  // d/dw w^2
    opt->step(0.1);
  }
  EXPECT_NEAR(w[0], 0.0, 1e-4);
}

}  // namespace
}  // namespace loom::optim
