// Mixed precision (Gpt::set_precision, docs/numerics.md "Mixed precision"): bf16 and f16
// follow f32 within their formats' precision; what forward keeps in 16 bits is exactly what
// it computed (full recompute, which recomputes everything, gives the same bits); the
// arena keeps about half of f32's, to the byte the memory plan predicts; an f16 overflow
// shows as an infinite gradient; and the bits depend on neither threads nor GEMM path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "loom/nn/gpt.h"
#include "loom/core/threads.h"
#include "loom_testing.h"

namespace loom::nn {
namespace {

struct Step {
  double loss = 0;
  std::vector<float> grads;
  size_t kept = 0;  // arena bytes forward leaves for backward
};

Step gpt_step(const GptConfig& cfg, DType precision, Recompute recompute = Recompute::kNone, double scale = 1.0,
              int64_t b = 4) {
  Gpt gpt(cfg);
  gpt.init(5);
  gpt.set_precision(precision);
  gpt.set_recompute(recompute);
  auto [x, y] = testing::random_tokens(b, cfg.seq_len, cfg.vocab_size, 6);
  GptCtx ctx;
  Step s;
  s.loss = gpt.forward(x, y, ctx);
  s.kept = ctx.arena.peak_bytes();
  gpt.backward(ctx, scale);
  const float* g = gpt.params().grads().data<float>();
  s.grads.assign(g, g + gpt.params().numel());
  return s;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(d / w);
}

const GptConfig kCfg{.n_layer = 3, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab_size = 97};

// The loss and the gradients stay within what 8 (bf16) or 11 (f16) significant bits allow:
// each rounding is at most 2^-9 or 2^-12 relative, and they do not add up coherently.
// Measured: gradients 0.6% (bf16) and 0.07% (f16) from f32's in relative L2 norm, losses
// 6e-6 and 4e-7 relative; the bounds leave 3x and more.
TEST(MixedPrecision, FollowsF32WithinTheFormatsPrecision) {
  const Step f32 = gpt_step(kCfg, DType::kF32);
  for (auto [format, loss_tol, grad_tol] : {std::tuple{DType::kBF16, 1e-3, 2e-2}, std::tuple{DType::kF16, 1e-4, 3e-3}}) {
    const Step got = gpt_step(kCfg, format);
    EXPECT_NEAR(got.loss, f32.loss, loss_tol * f32.loss) << dtype_name(format);
    const double err = relative_l2(got.grads, f32.grads);
    EXPECT_LT(err, grad_tol) << dtype_name(format);
    EXPECT_GT(err, 0) << dtype_name(format) << " rounded nothing";
  }
}

// Full recompute reruns each block's forward from its 16-bit input; none loads the 16-bit
// copies forward kept. Equal bits: the copies hold exactly what forward computed.
TEST(MixedPrecision, KeptActivationsAreExactAndHalfTheMemory) {
  const GptConfig wide{.n_layer = 4, .n_head = 4, .d_model = 128, .seq_len = 64, .vocab_size = 16};
  const Step f32 = gpt_step(wide, DType::kF32);
  for (DType format : {DType::kBF16, DType::kF16}) {
    const Step none = gpt_step(wide, format, Recompute::kNone);
    const Step full = gpt_step(wide, format, Recompute::kFull);
    EXPECT_EQ(none.loss, full.loss) << dtype_name(format);
    EXPECT_TRUE(none.grads == full.grads) << dtype_name(format);
    const double ratio = static_cast<double>(none.kept) / static_cast<double>(f32.kept);
    EXPECT_LT(ratio, 0.53) << dtype_name(format) << ": kept " << none.kept << " of f32's " << f32.kept;
    EXPECT_GT(ratio, 0.45) << dtype_name(format);
  }
}

TEST(MixedPrecision, ActivationBytesPredictTheArenaExactly) {
  const GptConfig shapes[] = {{.n_layer = 3, .n_head = 2, .d_model = 16, .seq_len = 32, .vocab_size = 13},
                              {.n_layer = 1, .n_head = 4, .d_model = 24, .seq_len = 9, .vocab_size = 50},
                              {.n_layer = 2, .n_head = 1, .d_model = 5, .seq_len = 7, .vocab_size = 3}};
  for (const GptConfig& cfg : shapes)
    for (DType format : {DType::kBF16, DType::kF16})
      for (int64_t b : {1, 3})
        for (Recompute mode : {Recompute::kNone, Recompute::kFull}) {
          const int64_t t = cfg.seq_len - 1;
          auto [tokens, targets] = testing::random_tokens(b, t, cfg.vocab_size, 4);
          Gpt gpt(cfg);
          gpt.init(3);
          gpt.set_recompute(mode);
          gpt.set_precision(format);
          GptCtx ctx;
          gpt.forward(tokens, targets, ctx);
          const std::string what = cat(dtype_name(format), ", d_model ", cfg.d_model, ", b ", b, ", recompute ",
                                       static_cast<int>(mode));
          const ActivationBytes fwd = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, false, 1, false, format);
          EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), fwd.arena) << what;
          EXPECT_EQ(static_cast<double>(gpt.recompute_peak_bytes()), fwd.workspace) << what;
          gpt.backward(ctx, 1.0);
          const ActivationBytes both = gpt_activation_bytes(cfg, cfg.n_layer, {}, b, t, mode, true, 1, false, format);
          EXPECT_EQ(static_cast<double>(ctx.arena.peak_bytes()), both.arena) << what;
          EXPECT_EQ(static_cast<double>(gpt.recompute_peak_bytes()), both.workspace) << what;
        }
}

// A loss scaled past what f16 holds overflows in backward: the gradients are infinite (what
// the loss scaler detects and skips), never silently wrong; bf16, with f32's exponent range,
// does not overflow there.
TEST(MixedPrecision, F16OverflowGivesInfiniteGradients) {
  auto finite = [](const std::vector<float>& g) {
    for (float v : g)
      if (!std::isfinite(v)) return false;
    return true;
  };
  EXPECT_FALSE(finite(gpt_step(kCfg, DType::kF16, Recompute::kNone, 1e12).grads));
  EXPECT_TRUE(finite(gpt_step(kCfg, DType::kF16, Recompute::kNone, 1024).grads));
  EXPECT_TRUE(finite(gpt_step(kCfg, DType::kBF16, Recompute::kNone, 1e12).grads));
}

}  // namespace

// ctest runs Determinism.* again under each OpenBLAS core type (src/nn/CMakeLists.txt).
namespace {
TEST(Determinism, MixedPrecisionDependsOnNeitherThreadsNorGemmPath) {
  for (DType format : {DType::kBF16, DType::kF16}) {
    set_compute_threads(1);
    const Step one = gpt_step(kCfg, format);
    for (int threads : {2, 3}) {
      set_compute_threads(threads);
      const Step got = gpt_step(kCfg, format);
      EXPECT_TRUE(got.loss == one.loss && got.grads == one.grads) << dtype_name(format) << " at " << threads;
    }
    for (kernels::GemmPath path : kernels::gemm_supported_paths()) {
      kernels::set_gemm_path(path);
      const Step got = gpt_step(kCfg, format);
      EXPECT_TRUE(got.loss == one.loss && got.grads == one.grads) << dtype_name(format) << " on " << kernels::gemm_path_name(path);
    }
    kernels::set_gemm_path(kernels::GemmPath::kAuto);
  }
  set_compute_threads(1);
}

// The AMX path's bf16 products sum in their own order (docs/numerics.md), so its step has
// bits of its own: the same at any thread count.
TEST(Determinism, AmxStepsDependNotOnThreads) {
  if (!kernels::gemm_path_supported(kernels::GemmPath::kAmx)) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16";
  kernels::set_gemm_path(kernels::GemmPath::kAmx);
  set_compute_threads(1);
  const Step one = gpt_step(kCfg, DType::kBF16);
  for (int threads : {2, 3}) {
    set_compute_threads(threads);
    const Step got = gpt_step(kCfg, DType::kBF16);
    EXPECT_TRUE(got.loss == one.loss && got.grads == one.grads) << "amx at " << threads << " threads";
  }
  kernels::set_gemm_path(kernels::GemmPath::kAuto);
  set_compute_threads(1);
}
}  // namespace
}  // namespace loom::nn
