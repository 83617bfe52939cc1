// Mixed-precision training from the CLI ([training] precision, docs/numerics.md "Mixed
// precision"): bf16 and fp16 loss curves stay within the documented tolerance of fp32 over
// 200 steps of gpt-nano; data and pipeline parallelism in deterministic mode train fp16
// bitwise as one process; an injected overflow skips its step (the weights and the optimizer state are
// left as they were) and halves the loss scale, which a resume carries on; bad settings are
// one-line errors.
#include <cmath>

#include "cli_fixture.h"

namespace loom {
namespace {

std::vector<double> numbers(const std::vector<std::string>& column) {
  std::vector<double> out;
  for (const std::string& s : column) out.push_back(s == "null" ? NAN : std::stod(s));
  return out;
}

TEST_F(Cli, MixedPrecisionLossCurvesTrackFp32) {
  const std::string common = " --quiet --training.steps=200 --training.warmup_steps=20 --training.eval_every=100 "
                             "--training.lr=1e-3 --checkpoint.every=0 --job.log_every=50";
  std::map<std::string, std::vector<double>> loss;
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    Result r = loom(cat("train ", p("nano.toml"), common, " --job.name=", precision, " --training.precision=", precision));
    ASSERT_EQ(r.code, 0) << precision << "\n" << r.err;
    loss[precision] = numbers(column(read_file(p(cat("runs/", precision, "/metrics.jsonl"))), "loss"));
    ASSERT_EQ(loss[precision].size(), 200u) << precision;
  }
  EXPECT_LT(loss["fp32"].back(), loss["fp32"].front() - 1.5) << "fp32 did not learn";
  // docs/numerics.md: the mean of |loss - fp32's| over every 20 steps within 2% of fp32's
  // (bf16) or 0.5% (fp16), and no step's loss more than 5% (bf16) or 2% (fp16) away.
  for (auto [precision, mean_tol, step_tol] : {std::tuple{"bf16", 0.02, 0.05}, std::tuple{"fp16", 0.005, 0.02}}) {
    const std::vector<double>& got = loss[precision];
    for (size_t w = 0; w < 200; w += 20) {
      double diff = 0, ref = 0;
      for (size_t s = w; s < w + 20; ++s) {
        diff += std::fabs(got[s] - loss["fp32"][s]);
        ref += loss["fp32"][s];
        EXPECT_LT(std::fabs(got[s] - loss["fp32"][s]), step_tol * loss["fp32"][s]) << precision << " step " << s + 1;
      }
      EXPECT_LT(diff, mean_tol * ref) << precision << " steps " << w + 1 << "-" << w + 20;
    }
  }
  const auto scale = column(read_file(p("runs/fp16/metrics.jsonl")), "loss_scale");
  ASSERT_EQ(scale.size(), 200u);
  EXPECT_EQ(column(read_file(p("runs/bf16/metrics.jsonl")), "loss_scale").size(), 0u) << "bf16 scales nothing";
}

TEST_F(Cli, Fp16DataParallelIsBitwiseOneProcessAndAnOverflowSkipsItsStep) {
  const std::string base = cat(p("nano.toml"), " --quiet --training.precision=fp16 --parallel.deterministic=true "
                               "--checkpoint.every=1 --checkpoint.keep=0 --training.decay=constant");
  ASSERT_EQ(loom(cat("train ", base, " --job.name=one")).code, 0);
  const std::string one = read_file(p("runs/one/metrics.jsonl"));
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::string>>{
           {"z1", "--parallel.zero=1"}, {"z3", "--parallel.zero=3"}, {"pp2", "--parallel.pp=2 --parallel.dp=1"}}) {
    Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", base, " --job.name=", name, " ", layout));
    ASSERT_EQ(r.code, 0) << layout << "\n" << r.err;
    EXPECT_EQ(column(read_file(p(cat("runs/", name, "/metrics.jsonl"))), "loss"), column(one, "loss")) << layout;
  }

  // Steps 3 and 4 overflow: skipped, the scale halved twice, and step 5 trains again.
  ASSERT_EQ(loom(cat("train ", base, " --job.name=over --training.loss_scale_window=2")).code, 0);
  Result r = [&] {
    testing::CommandResult c = testing::run_command(cat(LOOM_BINARY_DIR, "/loom train ", base,
                                                        " --job.name=skip --training.loss_scale_window=2 --debug.overflow_at=3,4 2>&1"));
    return Result{c.code, c.out, ""};
  }();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 3: fp16 gradients overflowed"), std::string::npos) << r.out;
  const std::string skip = read_file(p("runs/skip/metrics.jsonl"));
  EXPECT_EQ(column(skip, "skipped"), (std::vector<std::string>{"0", "0", "1", "1", "0", "0"}));
  // 65536, doubled after the window of 2 clean steps; x 2^40 in the injected steps, each
  // halving the scale; then two clean steps double it again.
  EXPECT_EQ(numbers(column(skip, "loss_scale")),
            (std::vector<double>{65536, 65536, 131072 * 0x1p40, 65536 * 0x1p40, 32768, 32768}));
  EXPECT_EQ(column(skip, "grad_norm")[2], "null");
  const std::string ck = p("runs/skip/checkpoints/step_");
  for (auto part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer}) {
    EXPECT_EQ(logical(ck + "2", part), logical(ck + "4", part)) << "a skipped step changed the state";
    EXPECT_NE(logical(ck + "4", part), logical(ck + "5", part));
  }
  // The steps before the overflow are the run without it.
  const std::string over = read_file(p("runs/over/metrics.jsonl"));
  EXPECT_EQ(column(skip, "loss")[0], column(over, "loss")[0]);
  EXPECT_EQ(column(skip, "loss")[1], column(over, "loss")[1]);

  // A resume from step 4 carries the lowered scale on: steps 5 and 6 as in the run above.
  r = [&] {
    testing::CommandResult c = testing::run_command(cat(LOOM_BINARY_DIR, "/loom train ", base,
                                                        " --job.name=cut --training.loss_scale_window=2 --training.steps=4 "
                                                        "--debug.overflow_at=3,4 2>&1"));
    return Result{c.code, c.out, ""};
  }();
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(loom(cat("train ", base, " --job.name=cut --training.loss_scale_window=2 --resume")).code, 0);
  const std::string cut = read_file(p("runs/cut/metrics.jsonl"));
  EXPECT_EQ(column(cut, "loss_scale"), column(skip, "loss_scale"));
  EXPECT_EQ(column(cut, "loss"), column(skip, "loss"));
}

TEST_F(Cli, MixedPrecisionRefusesWhatItCannotDo) {
  const std::string cfg = cat("train ", p("nano.toml"), " --job.name=bad");
  expect_bad_input(cfg + " --training.precision=fp8", {"training.precision", "fp8", "fp32, bf16, fp16"});
  expect_bad_input(cfg + " --dry-run --parallel.dp=1 --parallel.tp=2 --training.precision=bf16",
                   {"training.precision", "bf16", "parallel.tp = 2"});
  expect_bad_input(cfg + " --dry-run --parallel.dp=1 --parallel.pp=2 --parallel.pp_schedule=zb-h1 --training.precision=fp16",
                   {"training.precision", "fp16", "zb-h1"});
  expect_bad_input(cfg + " --training.precision=fp16 --training.loss_scale=1000", {"training.loss_scale", "1000", "power of two"});
  expect_bad_input(cfg + " --training.loss_scale_window=0", {"training.loss_scale_window", "0", ">= 1"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=bad --model.preset=mlp --training.precision=bf16"),
                   {"training.precision", "mlp", "fp32"});
  testing::CommandResult c = testing::run_command(cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                                      " --job.name=bad --debug.overflow_at=2 2>&1"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("debug.overflow_at"), std::string::npos) << c.out;
  EXPECT_FALSE(std::filesystem::exists(p("runs/bad")));
}

}  // namespace
}  // namespace loom
