// `loom train` with job.device = "cuda" (docs/gpu.md). What the GPU does not run is a
// one-line error before anything is written, on any machine. Where a GPU is visible (ctest
// label `gpu`; skipped elsewhere, saying why): gpt-nano trains there within bf16's
// tolerance of the CPU's bf16 loss curve, and one run moves CPU -> GPU -> CPU through its
// own checkpoints with --resume, staying on that curve.
#include <cmath>

#include "cli_fixture.h"
#include "loom/gpu/gpu.h"

namespace loom {
namespace {

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  for (const std::string& s : column(metrics, "loss")) out.push_back(std::stod(s));
  return out;
}

TEST_F(Cli, DeviceCudaRefusesWhatTheGpuDoesNotRun) {
  const std::string nano = cat("train ", p("nano.toml"), " --quiet --job.device=cuda");
  expect_bad_input(cat(nano, " --training.precision=fp32"), {"= \"cuda\" trains in bf16", "training.precision"});
  expect_bad_input(cat(nano, " --training.precision=bf16 --training.optimizer=sgd"), {"runs AdamW", "training.optimizer"});
  expect_bad_input(cat(nano, " --training.precision=bf16 --training.teacher=", p("teacher")), {"no training.teacher"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.device=tpu"), {"job.device", "tpu"});
  expect_bad_input(cat(nano, " --training.precision=bf16 --parallel.zero=3"), {"stage 3", "parallel.zero"});
  expect_bad_input(cat(nano, " --training.precision=bf16 --parallel.deterministic=true"),
                   {"parallel.deterministic", "on the GPU"});
  if (gpu::device_count() > 0) return;
  // No GPU here: said in one line, before the run directory is touched.
  const std::string before = snapshot(p("runs"));
  Result r = loom(cat(nano, " --training.precision=bf16"));
  EXPECT_EQ(r.code, gpu::compiled() ? 1 : 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(gpu::compiled() ? "no CUDA device 0" : "built without CUDA"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot(p("runs")), before);
}

// 30 steps at a constant learning rate: on the CPU alone, and as one run of three legs
// (10 on the CPU, 10 on the GPU, 10 on the CPU again), each resuming the last's checkpoint.
// Every step's loss within 2% of the CPU's (bf16's tolerance against fp32, docs/numerics.md:
// here two bf16 implementations that add in other orders).
TEST_F(Cli, TrainsOnTheGpuAndMovesBetweenCpuAndGpuWithResume) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device visible to this process";
  const std::string base = cat("train ", p("nano.toml"), " --quiet --training.precision=bf16 --training.decay=constant "
                               "--checkpoint.every=10 --training.eval_every=10");
  Result cpu = loom(cat(base, " --job.name=cpu --training.steps=30"));
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  for (const auto& [steps, device, resume] : {std::tuple{10, "cpu", ""}, std::tuple{20, "cuda", " --resume"},
                                              std::tuple{30, "cpu", " --resume"}}) {
    Result r = loom(cat(base, " --job.name=mixed --training.steps=", steps, " --job.device=", device, resume));
    ASSERT_EQ(r.code, 0) << device << " to step " << steps << "\n" << r.err;
  }
  const std::vector<double> want = losses(read_file(p("runs/cpu/metrics.jsonl")));
  const std::vector<double> got = losses(read_file(p("runs/mixed/metrics.jsonl")));
  ASSERT_EQ(want.size(), 30u);
  ASSERT_EQ(got.size(), 30u);
  for (size_t s = 0; s < 30; ++s) EXPECT_NEAR(got[s], want[s], 0.02 * want[s]) << "step " << s + 1;
  EXPECT_LT(got.back(), got.front()) << "did not learn";
}

// Data parallel on the GPU, plain and with ZeRO 1 and 2: two processes (sharing this machine's
// GPU, as ranks of a host beyond its devices do) train 10 steps with their gradients summed
// over Loom's transports, then one CPU process resumes their two-shard checkpoint for 10
// more; every step's loss within 2% of one CPU process's 20, the global batch being the same.
TEST_F(Cli, DataParallelOnTheGpuFollowsTheCpuAndResumesOnTheCpu) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device visible to this process";
  const std::string args = cat(p("nano.toml"), " --quiet --training.precision=bf16 --training.decay=constant "
                               "--checkpoint.every=10 --training.eval_every=10");
  Result cpu = loom(cat("train ", args, " --job.name=cpu --training.steps=20"));
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  const std::vector<double> want = losses(read_file(p("runs/cpu/metrics.jsonl")));
  ASSERT_EQ(want.size(), 20u);
  for (const int zero : {0, 1, 2}) {
    const std::string name = cat("dp", zero);
    Result dp = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", args, " --job.name=", name,
                         " --training.steps=10 --job.device=cuda --parallel.zero=", zero));
    ASSERT_EQ(dp.code, 0) << "zero " << zero << "\n" << dp.err;
    Result back = loom(cat("train ", args, " --job.name=", name, " --training.steps=20 --resume"));
    ASSERT_EQ(back.code, 0) << "zero " << zero << "\n" << back.err;
    const std::string metrics = read_file(p(cat("runs/", name, "/metrics.jsonl")));
    const std::vector<double> got = losses(metrics);
    ASSERT_EQ(got.size(), 20u);
    for (size_t s = 0; s < 20; ++s) EXPECT_NEAR(got[s], want[s], 0.02 * want[s]) << "zero " << zero << ", step " << s + 1;
    const std::vector<std::string> bytes = column(metrics, "comm_bytes");
    ASSERT_EQ(bytes.size(), 20u);
    EXPECT_GT(std::stod(bytes[0]), 0) << "the GPU ranks' gradients were not exchanged";
  }
}

}  // namespace
}  // namespace loom
