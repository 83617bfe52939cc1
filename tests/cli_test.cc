// The loom binary end to end: bad input of every kind gives exit code 2, one line naming
// the file or key and what was expected, and leaves an existing run directory untouched;
// a resumed run continues with bitwise-identical losses.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/data/data.h"
#include "loom/core/fileio.h"
#include "loom/checkpoint/safetensors.h"
#include "cli_fixture.h"
#include "loom_testing.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

TEST_F(Cli, HelpForEveryCommand) {
  for (const char* cmd : {"", "train", "sample", "eval", "data prepare", "bench train", "plan"}) {
    Result r = loom(cat(cmd, " --help"));
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd;
  }
}

// `loom bench train --breakdown`: a row of each part's ms a step per configuration, and each
// part's speed-up over the first thread count (the parts' accounting: nn_test StepBreakdown.*).
TEST_F(Cli, BenchTrainBreakdownGivesThePartsAndTheirSpeedUps) {
  const Result r = loom("bench train --preset gpt-nano --steps 1 --warmup 0 --threads 1 2 --micro-batch 1 "
                        "--precision bf16 --peak-gflops 100 --breakdown");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* want : {"where the step goes", "linear_fwd", "linear_dx", "linear_dw", "attn_bwd", "norm_bwd",
                           "edges_fwd", "optimizer", "other", "speed-up", "1->2"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
}

// `--shared-pack`: the mode reaches the products (the header says which), packing an operand
// once for every band changes no loss (the bits: kernels_test
// Gemm.AnOperandPackedOnceForEveryBandGivesTheSameBits), and any other mode is refused.
TEST_F(Cli, BenchTrainSharedPackRunsEitherWayWithTheSameLosses) {
  std::map<std::string, std::vector<std::string>> losses;
  for (const char* mode : {"on", "off"}) {
    const Result r = loom(cat("bench train --preset gpt-nano --steps 2 --warmup 0 --threads 2 --micro-batch 8 ",
                              "--precision fp32 bf16 --peak-gflops 100 --shared-pack ", mode));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(cat("shared packing ", mode)), std::string::npos) << r.out;
    std::istringstream rows(r.out);
    for (std::string line; std::getline(rows, line);) {
      std::istringstream fields(line);
      std::vector<std::string> f{std::istream_iterator<std::string>(fields), std::istream_iterator<std::string>()};
      if (f.size() == 12 && f[0] == "none") losses[mode].push_back(f[1] + " " + f[9]);  // precision, final_loss
    }
  }
  ASSERT_EQ(losses["on"].size(), 2u);
  EXPECT_EQ(losses["on"], losses["off"]);
  const Result bad = loom("bench train --shared-pack maybe");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--shared-pack"), std::string::npos) << bad.err;
}

TEST_F(Cli, BadConfigAndDataGiveOneLineAndExitTwo) {
  // An existing run, which nothing below may change.
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  const std::string cfg = p("nano.toml");
  const std::string fresh = " --job.name=fresh";
  expect_bad_input(cat("train ", p("missing.toml")), {"missing.toml", "not found"});
  write(p("unknown.toml"), "[training]\nstepz = 3\n");
  expect_bad_input(cat("train ", p("unknown.toml")), {"unknown.toml", "unknown key training.stepz"});
  write(p("type.toml"), "[training]\nsteps = \"many\"\n");
  expect_bad_input(cat("train ", p("type.toml")), {"type.toml", "training.steps", "expected an integer"});
  expect_bad_input(cat("train ", cfg, fresh, " --training.steps=abc"), {"training.steps", "expected an integer"});
  expect_bad_input(cat("train ", cfg, fresh, " --training.nope=1"), {"unknown key training.nope"});
  expect_bad_input(cat("train ", cfg, fresh, " --model.d_model=0"), {"model.d_model", "positive"});
  expect_bad_input(cat("train ", cfg, fresh, " --training.micro_batch=-2"), {"training.micro_batch", "positive"});
  expect_bad_input(cat("train ", cfg, fresh, " --model.d_model=66 --model.n_head=4"), {"model.d_model", "not divisible", "n_head"});
  expect_bad_input(cat("train ", cfg, fresh, " --data.train=", p("nope.bin")), {"nope.bin", "cannot open"});
  std::string raw = read_file(p("train.bin"));
  write(p("trunc.bin"), raw.substr(0, raw.size() - 7));
  expect_bad_input(cat("train ", cfg, fresh, " --data.train=", p("trunc.bin")), {"trunc.bin", "truncated"});
  raw[0] = 1;
  write(p("magic.bin"), raw);
  expect_bad_input(cat("train ", cfg, fresh, " --data.train=", p("magic.bin")), {"magic.bin", "magic", "20240520"});
  expect_bad_input(cat("train ", cfg), {"run directory exists", "--resume"});
  expect_bad_input(cat("train ", cfg, fresh, " --parallel.dp=2"), {"parallel.dp", "the job has 1 rank"});
  expect_bad_input(cat("train ", cfg, fresh, " --parallel.tp=2"), {"parallel.dp x parallel.tp x parallel.pp = 0 x 2 x 1"});
  expect_bad_input(cat("train ", cfg, fresh, " --parallel.zero=4"), {"parallel.zero", "expected 0, 1, 2 or 3"});
  expect_bad_input(cat("train ", cfg, fresh, " --comm.param_dtype=bf16"), {"comm.param_dtype", "only ZeRO-3"});
  expect_bad_input(cat("train ", cfg, fresh, " --parallel.zero=3 --comm.param_dtype=bf16 --parallel.deterministic=true"),
                   {"comm.param_dtype", "deterministic"});
  expect_bad_input(cat("train ", cfg, fresh, " --parallel.deterministic=true --comm.grad_dtype=bf16"),
                   {"comm.grad_dtype", "deterministic"});
}

TEST_F(Cli, PlanPredictsTheBubbleAndDrawsTheSchedule) {
  Result all = loom("plan --pp 4 --microbatches 8 --schedule all");
  ASSERT_EQ(all.code, 0) << all.err;
  // Each schedule's simulated bubble beside its closed form: 3/11, 3/19 (v = 2), 3/27.
  for (const char* row : {"1f1b               1          33     27.3%     27.3%",
                          "interleaved        2        28.5     15.8%     15.8%",
                          "zb-h1              1          27     11.1%     11.1%"})
    EXPECT_NE(all.out.find(row), std::string::npos) << row << " in\n" << all.out;

  Result one = loom(cat("plan --pp 2 --microbatches 2 --schedule gpipe --backward-ms 1 --width 12 --svg ", p("plan.svg")));
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("stage 0 |F0F1....B0B1|\nstage 1 |..F0F1B0B1..|"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("stage 0: busy 4 ms, idle 2 ms, peak 2 chunk activation(s)"), std::string::npos) << one.out;
  const std::string svg = read_file(p("plan.svg"));
  EXPECT_TRUE(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));

  // Measured stages: a config's model, each stage's part run on this machine.
  Result measured = loom(cat("plan --pp 2 --microbatches 4 --schedule all --config ", p("nano.toml")));
  ASSERT_EQ(measured.code, 0) << measured.err;
  for (const char* f : {"stage 0 measured: forward", "stage 1 measured: forward", "per micro-batch of 2 x 64 tokens",
                        "1f1b               1", "zb-h1              1",
                        "model.n_layer = 2 blocks are not divisible among --pp x virtual stages = 4"})
    EXPECT_NE(measured.out.find(f), std::string::npos) << f << " in\n" << measured.out;
  expect_bad_input(cat("plan --pp 2 --config ", p("nope.toml")), {"nope.toml", "not found"});
  expect_bad_input("plan --pp 4 --microbatches 6 --schedule interleaved --virtual-stages 2",
                   {"micro-batches = 6", "interleaved", "multiple of 4"});
  expect_bad_input("plan --pp 4 --schedule zb", {"pipeline schedule \"zb\"", "zb-h1"});
  expect_bad_input("plan --pp 2 --schedule 1f1b --virtual-stages 2", {"virtual stages = 2", "interleaved"});
  expect_bad_input("plan --pp 2 --transfer-ms -1", {"--transfer-ms = -1", "expected a number in [0, 1e+09]"});
}

TEST_F(Cli, CorruptIdxIsNamed) {
  fs::create_directories(p("fm"));
  auto gz = [&](const std::string& name, const std::string& bytes) {
    gzFile f = gzopen(p("fm/" + name).c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  };
  std::string img("\0\0\x08\x03\0\0\0\x02\0\0\0\x1c\0\0\0\x1c", 16);
  gz("train-images-idx3-ubyte.gz", img + std::string(784, '\x10'));  // says 2 images, holds 1
  gz("train-labels-idx1-ubyte.gz", std::string("\0\0\x08\x01\0\0\0\x02\x01\x02", 10));
  write(p("mlp.toml"), cat("[job]\nrun_dir = \"", p("runs"), "\"\n[model]\npreset = \"mlp\"\n[data]\ntrain = \"fashion-mnist:",
                           p("fm"), "\"\n"));
  expect_bad_input(cat("train ", p("mlp.toml")), {"train-images-idx3-ubyte.gz", "size mismatch"});
}

TEST_F(Cli, BadSafetensorsAndCheckpointsAreNamed) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  auto raw = [&](const std::string& name, const std::string& header, size_t data) {
    std::string s(8, '\0');
    uint64_t n = header.size();
    std::memcpy(s.data(), &n, 8);
    write(p(name), s + header + std::string(data, '\0'));
  };
  raw("notjson.safetensors", "{oops", 0);
  expect_bad_input(cat("eval --checkpoint ", p("notjson.safetensors"), " --data ", p("val.bin")), {"notjson.safetensors", "not JSON"});
  raw("past.safetensors", R"({"wte.weight":{"dtype":"F32","shape":[256,64],"data_offsets":[0,65536]}})", 100);
  expect_bad_input(cat("eval --checkpoint ", p("past.safetensors"), " --data ", p("val.bin")), {"past.safetensors", "past the end"});
  // A real checkpoint's weights, loaded as a model of another shape.
  const std::string weights = p("runs/r/checkpoints/step_3/model-00000.safetensors");
  expect_bad_input(cat("eval --checkpoint ", weights, " --data ", p("val.bin"), " --model.n_head=3"), {"not divisible"});
  // Resume with a different model shape: the checkpoint says gpt-nano d_model 64.
  expect_bad_input(cat("train ", p("nano.toml"), " --resume --model.d_model=32"), {"checkpoint of model", "d_model"});
  expect_bad_input(cat("train ", p("nano.toml"), " --resume --job.seed=7"), {"trained with job.seed = 1337", "says 7"});
  // Eval of a GPT-2-shaped tensor set whose shapes disagree with each other.
  std::string good = read_file(weights);
  SafetensorsFile f = SafetensorsFile::open(weights);
  EXPECT_GT(f.entries().size(), 10u);
  // Corrupt one byte of a checkpoint file: the hash check refuses it before use.
  std::string bad = good;
  bad[bad.size() - 3] ^= 1;
  write(weights, bad);
  expect_bad_input(cat("eval --checkpoint ", p("runs/r"), " --data ", p("val.bin")), {"model-00000.safetensors", "SHA-256 mismatch"});
}

TEST_F(Cli, ShapeMismatchInBareSafetensorsIsNamed) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  // Rename h.1 to h.2: the file then describes layers {0, 2}, a shape no GPT has.
  SafetensorsFile f = SafetensorsFile::open(p("runs/r/checkpoints/step_3/model-00000.safetensors"));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& e : f.entries()) {
    Tensor t = Tensor::zeros(e.shape, DType::kF32);
    f.read_into(e, t);
    std::string n = e.name;
    if (n.find(".wpe.") != std::string::npos) t = Tensor::zeros({64, 32}, DType::kF32);  // wrong width
    ts.emplace_back(n, t);
  }
  write_safetensors(p("odd.safetensors"), ts);
  expect_bad_input(cat("eval --checkpoint ", p("odd.safetensors"), " --data ", p("val.bin"), " --model.n_head=2"),
                   {"odd.safetensors", "transformer.wpe.weight", "[64, 32]", "[64, 64]"});
}

TEST_F(Cli, ResumeIsBitwiseIdentical) {
  // Uninterrupted: 6 steps, checkpoints at 3 and 6.
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=full")).code, 0);
  // Interrupted after step 3: same config, the run stopped (we drop what came after step 3).
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=cut")).code, 0);
  fs::remove_all(p("runs/cut/checkpoints/step_6"));
  write(p("runs/cut/checkpoints/latest"), "step_3\n");
  Result r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=cut --resume"));
  ASSERT_EQ(r.code, 0) << r.err;
  // loss, lr and grad_norm (and val_loss) of every step are equal to the last bit.
  auto losses = [&](const std::string& run) {
    std::vector<std::string> out;
    std::istringstream in(read_file(p("runs/" + run + "/metrics.jsonl")));
    for (std::string line; std::getline(in, line);) {
      std::string keep = line.substr(0, line.find(", \"tokens\""));
      auto v = line.find("\"val_loss\"");
      if (v != std::string::npos) keep += line.substr(v, line.find_first_of(",}", v) - v);
      out.push_back(keep);
    }
    return out;
  };
  auto full = losses("full"), cut = losses("cut");
  ASSERT_EQ(full.size(), 6u);
  EXPECT_EQ(full, cut);
  EXPECT_EQ(logical(p("runs/full/checkpoints/step_6"), checkpoint::Part::kModel),
            logical(p("runs/cut/checkpoints/step_6"), checkpoint::Part::kModel));
}

TEST_F(Cli, DataPrepareSampleAndEval) {
  fs::create_directories(p("txt"));
  write(p("txt/a"), std::string(3000, 'x'));
  Result r = loom(cat("data prepare text:", p("txt"), " --out ", p("out/t.bin")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("t_val.bin"), std::string::npos);
  EXPECT_EQ(data::read_tokens(p("out/t.bin")).size(), 2700u);
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  r = loom(cat("sample --checkpoint ", p("runs/r"), " --tokens 20 --prompt The"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("The")) << r.out;
  // Decoding with the key/value cache picks the tokens the whole window's forward picks
  // (inside the first window the two see the same tokens; their logits differ by rounding).
  const Result recomputed = loom(cat("sample --checkpoint ", p("runs/r"), " --tokens 20 --prompt The --no-kv-cache"));
  EXPECT_EQ(recomputed.code, 0) << recomputed.err;
  EXPECT_EQ(recomputed.out, r.out);
  r = loom(cat("eval --checkpoint ", p("runs/r/checkpoints/step_3"), " --data ", p("val.bin")));
  EXPECT_EQ(r.code, 0) << r.err;
  // 2000 tokens, windows of 64: 31 full windows x 64 targets.
  EXPECT_TRUE(r.out.starts_with("{\"loss\": ")) << r.out;
  EXPECT_NE(r.out.find("\"tokens\": 1984}"), std::string::npos) << r.out;
}

// "... parameters 0.449 MiB ..." -> 0.449: the number after `key` in `text` (-1 when absent).
TEST_F(Cli, GemmPathAndThreadsDoNotChangeTheBits) {
  const std::string base = cat("train ", p("nano.toml"), " --quiet --checkpoint.every=6");
  ASSERT_EQ(loom(cat(base, " --job.name=auto")).code, 0);
  Result r = loom(cat(base, " --job.name=generic --job.gemm_path=generic --job.threads=2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto bits = loss_columns(read_file(p("runs/auto/metrics.jsonl")));
  ASSERT_EQ(bits.size(), 6u);
  EXPECT_EQ(bits, loss_columns(read_file(p("runs/generic/metrics.jsonl"))));
  EXPECT_EQ(logical(p("runs/auto/checkpoints/step_6"), checkpoint::Part::kModel),
            logical(p("runs/generic/checkpoints/step_6"), checkpoint::Part::kModel));
  r = loom(cat(base, " --job.name=blas --job.gemm=openblas"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(loss_columns(read_file(p("runs/blas/metrics.jsonl"))).size(), 6u);
  expect_bad_input(cat(base, " --job.name=x --job.gemm=mkl"), {"job.gemm", "\"mkl\"", "loom, openblas"});
  expect_bad_input(cat(base, " --job.name=x --job.gemm_path=neon"), {"job.gemm_path", "avx512, avx2, generic"});
  // A path the CPU lacks is refused before anything is written, naming what it needs.
  std::ifstream cpuinfo("/proc/cpuinfo");  // (procfs files have no size for read_file)
  const std::string flags{std::istreambuf_iterator<char>(cpuinfo), std::istreambuf_iterator<char>()};
  ASSERT_NE(flags.find("flags"), std::string::npos);
  if (flags.find(" amx_bf16") == std::string::npos)
    expect_bad_input(cat(base, " --job.name=x --job.gemm_path=amx"), {"job.gemm_path = \"amx\"", "AMX-TILE and AMX-BF16"});
  expect_bad_input(cat(base, " --job.name=x --job.gemm=openblas --job.gemm_path=avx2"), {"job.gemm_path", "job.gemm"});
}

// [profile] trace_steps: one Chrome-trace file for the run holding every rank's chosen
// steps, their blocks, collectives and waits, properly nested, and the communication
// track's bytes adding up to the step's comm_bytes metric.
// A pipeline's trace shows the schedule as it ran: each stage's forward and backward of
// every micro-batch once, one after another, inside the step's pipeline span, and the waits
// for a neighbour named by micro-batch and stage.
}  // namespace

// Runs `train` under a 2-rank launcher, kills rank 1 once a dozen steps are logged (a
// checkpoint exists), and checks the job stops within 2 s with a line holding every
// fragment; then resumes and checks the run ends as `full` (run uninterrupted) did.
void Cli::kill_and_resume(const std::string& train, const std::string& steps,
                          std::initializer_list<std::string> fragments) {
  ASSERT_EQ(loom(cat("launch -n 2 -- ", train, " --job.name=full")).code, 0);

  const pid_t launcher = launch_in_background(cat("-n 2 -- ", train, " --job.name=cut"), p("cut.out"));
  ASSERT_GE(launcher, 0);
  const std::string metrics = p("runs/cut/metrics.jsonl");
  wait_for_lines(metrics, 12);
  pid_t victim = rank_pid(launcher, 1);
  ASSERT_GT(victim, 0);
  const Ended ended = signal_and_wait(victim, SIGKILL, launcher);
  EXPECT_LT(ended.seconds, 2.0) << "the job took over 2 s to stop";
  EXPECT_EQ(WEXITSTATUS(ended.status), 128 + SIGKILL);
  const std::string out = read_file(p("cut.out"));
  for (const auto& f : fragments) EXPECT_NE(out.find(f), std::string::npos) << "missing '" << f << "' in: " << out;
  ASSERT_LT(line_count(metrics), std::stoll(steps)) << "rank 1 was killed after the run ended";

  Result r = loom(cat("launch -n 2 -- ", train, " --job.name=cut --resume"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(loss_columns(read_file(p("runs/full/metrics.jsonl"))), loss_columns(read_file(metrics)));
  EXPECT_EQ(logical(p(cat("runs/full/checkpoints/step_", steps)), checkpoint::Part::kModel),
            logical(p(cat("runs/cut/checkpoints/step_", steps)), checkpoint::Part::kModel));
}

namespace {

TEST_F(Cli, KilledRankStopsTheJobNamingRankAndStepAndResumeIsBitwise) {
  kill_and_resume(cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --training.steps=300 --checkpoint.every=5 --parallel.zero=3 --training.eval_every=0"),
                  "300", {"rank 1 (pid", "rank 0 at step ", "rank 1 died"});
}

// A stage killed mid-pipeline: the other stage names itself, its stage and the step, and
// the dead rank; a resume on the pipeline layout continues bitwise (deterministic mode).
TEST_F(Cli, KilledPipelineStageStopsTheJobNamingRankStageAndStep) {
  kill_and_resume(cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --training.steps=300 --checkpoint.every=5 --parallel.pp=2 --training.micro_batch=1 "
                      "--parallel.deterministic=true --training.eval_every=0"),
                  "300", {"rank 0 (stage 0 of 2, replica 0) at step ", "rank 1 died"});
}

// A tensor-parallel piece killed mid-step (its peer waits in a seam all-reduce or the norm's):
// the other piece names itself, its tp index and the step, and the dead rank; a resume on
// tp = 2 continues bitwise.
TEST_F(Cli, KilledTensorParallelPieceStopsTheJobNamingRankPieceAndStep) {
  kill_and_resume(cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --training.steps=300 --checkpoint.every=5 --parallel.tp=2 --training.eval_every=0"),
                  "300", {"rank 0 (tp 0 of 2, replica 0) at step ", "rank 1 died"});
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A reader that is not Loom's (tools/read_safetensors.py, from the format description)
// loads Loom's checkpoint weights with the same names, shapes and values.
TEST_F(Cli, IndependentReaderLoadsLoomWeights) {
  if (const std::string why = testing::python_unusable(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  const std::string file = p("runs/r/checkpoints/step_3/model-00000.safetensors");
  const std::string cmd = cat(testing::kPython, " ", LOOM_SOURCE_DIR, "/tools/read_safetensors.py ", file, " 2>&1");
  auto [code, out] = testing::run_command(cmd);
  ASSERT_EQ(code, 0) << out;
  SafetensorsFile st = SafetensorsFile::open(file);
  EXPECT_EQ(static_cast<size_t>(std::count(out.begin(), out.end(), '\n')), st.entries().size());
  for (const auto& e : st.entries()) {
    Tensor t = Tensor::zeros(e.shape, DType::kF64);
    st.read_into(e, t);
    double sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sum += t.data<double>()[i];
    std::istringstream lines(out);
    bool found = false;
    for (std::string line; std::getline(lines, line);) {
      if (!line.starts_with(e.name + " float32 ")) continue;
      found = true;
      EXPECT_NEAR(std::stod(line.substr(line.rfind(' ') + 1)), sum, 1e-9 * (1 + std::fabs(sum))) << line;
    }
    EXPECT_TRUE(found) << e.name << " missing from:\n" << out;
  }
}

// Weights exported as a bare file without the "transformer." prefix (as Hugging Face
// publishes GPT-2) evaluate to exactly the loss of the checkpoint they came from.
TEST_F(Cli, EvalOfBareHuggingFaceStyleFileMatchesCheckpoint) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  SafetensorsFile st = SafetensorsFile::open(p("runs/r/checkpoints/step_3/model-00000.safetensors"));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& e : st.entries()) {
    Tensor t = Tensor::zeros(e.shape, DType::kF32);
    st.read_into(e, t);
    ts.emplace_back(e.name.substr(std::string("transformer.").size()), t);
  }
  write_safetensors(p("hf.safetensors"), ts);
  Result a = loom(cat("eval --checkpoint ", p("runs/r"), " --data ", p("val.bin")));
  Result b = loom(cat("eval --checkpoint ", p("hf.safetensors"), " --data ", p("val.bin"), " --model.n_head=2"));
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  Result s = loom(cat("sample --checkpoint ", p("hf.safetensors"), " --model.n_head=2 --tokens 10 --prompt ab"));
  EXPECT_EQ(s.code, 0) << s.err;
  EXPECT_TRUE(s.out.starts_with("ab")) << s.out;
}

// One rank fails while the others ignore SIGTERM: the launcher must kill them, exit with
// the failing rank's code within 2 s of the failure, and name the rank in one line.
TEST_F(Cli, LaunchTearsDownWithinTwoSecondsAndNamesTheRank) {
  write(p("rank.sh"), "trap '' TERM\nif [ \"$RANK\" = 1 ]; then sleep 0.5; date +%s%N > " + p("failed_at") +
                          "; exit 7; fi\nwhile :; do sleep 0.05; done\n");
  Result r = loom(cat("launch -n 3 -- sh ", p("rank.sh")));
  auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit code 7"), std::string::npos) << r.err;
  std::ifstream f(p("failed_at"));
  long long failed_ns = 0;
  ASSERT_TRUE(f >> failed_ns);
  EXPECT_LT(now_ns - failed_ns, 2'000'000'000LL) << "the launcher took over 2 s to tear down";
}

// `loom launch --bind cores`: each local rank runs on its own share of the launcher's CPUs
// (disjoint, covering them, a line saying where), under a launcher confined to one CPU too;
// more ranks than CPUs is one line and exit 2 with nothing started.
TEST_F(Cli, LaunchBindsEachRankToItsOwnCores) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  const int n = std::min<int>(static_cast<int>(allowed.size()), 4);
  ASSERT_GE(n, 1);
  Result r = loom(
      cat("launch -n ", n, " --bind cores -- sh -c 'echo cpus $(grep Cpus_allowed_list /proc/self/status | cut -f2)'"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("loom launch: bound to cores: rank 0 on CPUs "), std::string::npos) << r.err;
  std::vector<int> seen;
  for (int rank = 0; rank < n; ++rank) {
    const std::string tag = cat("[rank ", rank, "] cpus ");
    const size_t at = r.out.find(tag);
    ASSERT_NE(at, std::string::npos) << r.out;
    std::istringstream list(r.out.substr(at + tag.size(), r.out.find('\n', at) - at - tag.size()));
    size_t mine = 0;
    for (std::string part; std::getline(list, part, ',');) {
      const size_t dash = part.find('-');
      const int lo = std::stoi(part), hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      for (int c = lo; c <= hi; ++c, ++mine) seen.push_back(c);
    }
    EXPECT_GE(mine, allowed.size() / n - 1) << r.out;  // a share, not one CPU of many
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, allowed) << r.out;  // disjoint, and together every CPU the launcher had
  // A launcher confined to its last CPU puts its one rank there.
  const std::string last = std::to_string(allowed.back());
  testing::CommandResult confined = testing::run_command(
      cat("taskset -c ", last, " ", LOOM_BINARY_DIR, "/loom launch -n 1 --bind cores -- grep Cpus_allowed_list /proc/self/status 2>&1"));
  EXPECT_EQ(confined.code, 0) << confined.out;
  EXPECT_NE(confined.out.find(cat("[rank 0] Cpus_allowed_list:\t", last, "\n")), std::string::npos) << confined.out;
  r = loom(cat("launch -n ", allowed.size() + 1, " --bind cores -- touch ", p("started")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(cat(allowed.size() + 1, " local ranks, but this launcher may run on only ", allowed.size(), " CPU(s)")),
            std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(p("started")));
}

// `loom bench comm --dirty-inputs` (bench/comm_vs_peers.sh DIRTY=1) writes every line of each
// call's input before the call; the checked call still gets every op right, so the rewrite
// changes no byte, at a size within one slot round and one past it.
TEST_F(Cli, BenchCommWithDirtyInputsChecksEveryOp) {
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom bench comm --dirty-inputs",
                      " --op all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all",
                      " --sizes 4K,3M --reps 1 --warmup 1 --iters 2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("inputs rewritten before each call"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  size_t ok = 0;
  for (size_t at = r.out.find(" ok "); at != std::string::npos; at = r.out.find(" ok ", at + 1)) ++ok;
  EXPECT_EQ(ok, 12u) << r.out;  // 6 ops x 2 sizes
}

// `--shared-inputs` puts each call's input where the peers read it in place; `--ab-shared`
// times an ordinary and a shared input in alternate reps, a checked row for each and their
// ratio per size.
TEST_F(Cli, BenchCommReadsSharedInputsInPlace) {
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom bench comm --shared-inputs",
                      " --op all_reduce,all_gather,reduce_scatter,broadcast --sizes 4K,3M --reps 1 --warmup 1 --iters 2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("inputs in shared memory: same-host peers read them in place"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("shared / ordinary"), std::string::npos) << r.out;
  r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom bench comm --ab-shared --dirty-inputs",
               " --op all_reduce,all_gather --sizes 4K,3M --reps 2 --warmup 1 --iters 2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  size_t ok = 0, ratios = 0;
  for (size_t at = r.out.find(" ok "); at != std::string::npos; at = r.out.find(" ok ", at + 1)) ++ok;
  for (size_t at = r.out.find("shared / ordinary busbw: "); at != std::string::npos;
       at = r.out.find("shared / ordinary busbw: ", at + 1))
    ++ratios;
  EXPECT_EQ(ok, 8u) << r.out;  // 2 ops x 2 sizes x 2 inputs
  EXPECT_EQ(ratios, 4u) << r.out;
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST_F(Cli, DryRunPrintsTheMemoryPlanAndWritesNothing) {
  const Result r = loom(cat("train ", p("nano.toml"), " --dry-run --parallel.dp=2 --parallel.zero=1"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("memory per rank: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory on this host: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("for 2 rank(s)"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(p("runs"))) << "a dry run wrote the run directory";
  // The plan's model state is what a run then measures (resident pages, so a little more).
  const Result run = loom(cat("train ", p("nano.toml"), " --training.steps=1"));
  ASSERT_EQ(run.code, 0) << run.err;
  const Result plan = loom(cat("train ", p("nano.toml"), " --dry-run"));
  for (const char* part : {"parameters ", "gradients ", "optimizer "}) {
    const double planned = figure_after(plan.out, part), measured = figure_after(run.err.substr(run.err.find("model state")), part);
    EXPECT_GT(planned, 0) << plan.out;
    EXPECT_NEAR(measured, planned, 0.02 * planned + 0.01) << part << "\n" << plan.out << run.err;
  }
  // loom plan prints the same figures for the same config.
  const Result planned = loom(cat("plan --config ", p("nano.toml"), " --pp 2 --microbatches 2"));
  ASSERT_EQ(planned.code, 0) << planned.err;
  EXPECT_EQ(planned.out.substr(0, planned.out.find("memory on this host")),
            plan.out.substr(0, plan.out.find("memory on this host")));
}

TEST_F(Cli, RunThatCannotFitIsRefusedBeforeAllocating) {
  // gpt2-124m's shape with 2^20 sequences per micro-batch: terabytes of activations. Refused
  // with the figures, at once, before the model or the data is touched.
  const std::string big = " --model.n_layer=12 --model.n_head=12 --model.d_model=768 --model.seq_len=1024 "
                          "--model.vocab_size=50257 --training.micro_batch=1048576 --training.global_batch=1048576";
  expect_bad_input(cat("train ", p("nano.toml"), big), {"needs ", " GiB on this host", "GiB are available", "activations"});
  expect_bad_input(cat("train ", p("nano.toml"), " --dry-run", big), {"needs ", "GiB are available"});
  expect_bad_input(cat("train ", p("nano.toml"), " --model.d_model=4611686018427387904"),
                   {"model.d_model", "4611686018427387904", "at most 2147483647"});
  expect_bad_input(cat("train ", p("nano.toml"), " --model.d_model=1048576 --model.n_layer=1048576"),
                   {"model.d_model = 1048576 with n_layer = 1048576", "at most 2^40"});
}

}  // namespace
}  // namespace loom
