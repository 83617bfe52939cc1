// The trainer as a library (loom/train/train.h): a C++ program that builds a TrainConfig
// itself and calls train::run in its own process trains as `loom train` does from the same
// settings in a TOML file: the same losses and gradient norms, bit for bit, and the same
// run directory (metrics, checkpoints).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "config.h"
#include "config_train.h"
#include "loom/core/threads.h"
#include "loom/train/train.h"

namespace loom {
namespace {

using json = nlohmann::json;
using testing::expect_input_error;

// Every line of a run's metrics.jsonl that reports a step.
std::vector<json> step_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("step") && j.contains("loss")) lines.push_back(std::move(j));
  }
  return lines;
}

class TrainLibrary : public Cli {
 protected:
  // gpt-nano on the fixture's corpus, 4 steps, a checkpoint at step 4: as `settings` says in
  // TOML for `loom train`.
  train::TrainConfig config(const std::string& run) const {
    train::TrainConfig t;
    t.job = {.run = run, .seed = 7, .threads = 1, .log_every = 1};
    t.model.kind = "gpt";
    t.model.gpt = {.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256};
    t.data.train = p("train.bin");
    t.data.prefetch = 2;
    t.training = {.steps = 4, .global_batch = 4, .micro_batch = 2, .precision_name = "fp32"};
    t.schedule = {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 2, .total_steps = 4, .decay = "cosine"};
    t.parallel.layout = {.dp = 1, .pp = 1, .v = 1, .tp = 1};
    t.parallel.pp_schedule = "1f1b";
    t.parallel.step.micro_batch = 2;
    t.parallel.step.accum = 2;
    t.parallel.step.t = 64;
    t.parallel.step.grad_clip = 1.0;
    t.comm = {.transport = "auto", .timeout_s = 60};
    t.checkpoint = {.root = run + "/checkpoints", .keep = 2, .every = 4};
    t.toml = settings(run);
    t.layout = "dp=1 tp=1 pp=1";
    return t;
  }
  std::string settings(const std::string& run) const {
    const std::filesystem::path r(run);
    return cat("[job]\nname = \"", r.filename().string(), "\"\nrun_dir = \"", r.parent_path().string(),
               "\"\nseed = 7\nthreads = 1\nlog_every = 1\n[model]\nn_layer = 2\nn_head = 2\nd_model = 64\n"
               "seq_len = 64\nvocab_size = 256\n[data]\ntrain = \"",
               p("train.bin"), "\"\nprefetch = 2\n[training]\nsteps = 4\nglobal_batch = 4\nmicro_batch = 2\n"
               "lr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 2\ndecay = \"cosine\"\nweight_decay = 0.1\ngrad_clip = 1.0\n"
               "[comm]\ntimeout_s = 60\n[checkpoint]\nevery = 4\nkeep = 2\n");
  }
};

TEST_F(TrainLibrary, ARunFromATypedConfigEqualsTheCommandLines) {
  write(p("lib.toml"), settings(p("runs/cli")));
  const Result cli = loom(cat("train ", p("lib.toml"), " --quiet"));
  ASSERT_EQ(cli.code, 0) << cli.err;

  train::RunStart start;
  start.tc = config(p("runs/lib"));
  ASSERT_EQ(train::run(train::RunOptions{.quiet = true}, start), 0);

  const std::vector<json> a = step_lines(p("runs/cli/metrics.jsonl")), b = step_lines(p("runs/lib/metrics.jsonl"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i]["step"]);
    EXPECT_EQ(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) << "step " << a[i]["step"];
    EXPECT_EQ(b[i]["grad_norm"].get<double>(), a[i]["grad_norm"].get<double>()) << "step " << a[i]["step"];
    EXPECT_EQ(b[i]["lr"].get<double>(), a[i]["lr"].get<double>()) << "step " << a[i]["step"];
  }
  // The same weights saved, and the same config beside them.
  const auto ck_a = checkpoint::Checkpoint::open(p("runs/cli/checkpoints/step_4"));
  const auto ck_b = checkpoint::Checkpoint::open(p("runs/lib/checkpoints/step_4"));
  const std::vector<checkpoint::TensorInfo> tensors = ck_a.tensors();
  ASSERT_FALSE(tensors.empty());
  EXPECT_EQ(ck_b.tensors().size(), tensors.size());
  for (const checkpoint::TensorInfo& info : tensors) {
    const Tensor x = ck_a.read(info.name, DType::kF32), y = ck_b.read(info.name, DType::kF32);
    ASSERT_EQ(x.numel(), y.numel()) << info.name;
    EXPECT_EQ(std::memcmp(x.data<float>(), y.data<float>(), x.numel() * sizeof(float)), 0) << info.name;
  }
  EXPECT_TRUE(std::filesystem::exists(p("runs/lib/config.toml")));
}

// The run sizes this process's compute threads as job.threads says (loom train's share of
// the cores, resolved; here more than this machine has, so that it is not the default).
TEST_F(TrainLibrary, TheRunTakesItsComputeThreadsFromTheJob) {
  train::RunStart start;
  start.tc = config(p("runs/lib"));
  start.tc.job.threads = 3;
  start.tc.training.steps = start.tc.schedule.total_steps = 1;
  ASSERT_EQ(train::run(train::RunOptions{.quiet = true}, start), 0);
  EXPECT_EQ(compute_threads(), 3);
  start.tc = config(p("runs/lib2"));
  start.tc.job.gemm_path = "sparc";
  expect_input_error([&] { train::run({}, start); }, {"job.gemm_path = \"sparc\""});
  EXPECT_FALSE(std::filesystem::exists(p("runs/lib2")));
}

// A manifest of remote shards needs a cache directory, which loom train's config resolves
// (docs/data.md) and a TrainConfig built by hand may leave empty: refused naming both, before
// anything is fetched or written.
TEST_F(TrainLibrary, RemoteShardsWithoutACacheDirectoryAreRefused) {
  write(p("remote.json"), cat(R"({"format": "loom-dataset", "version": 1, "tokens": 100000, "tokenizer": "bytes", )",
                              R"("vocab_size": 256, "shards": [{"url": "http://127.0.0.1:9/train.bin", "tokens": 100000, )",
                              R"("dtype": "uint16", "sha256": ")", std::string(64, '0'), R"("}]})"));
  train::RunStart start;
  start.tc = config(p("runs/lib"));
  start.tc.data.train = p("remote.json");
  expect_input_error([&] { train::run({}, start); }, {"remote.json", "remote", "data.cache_dir is empty"});
  EXPECT_FALSE(std::filesystem::exists(p("runs/lib")));
}

// What only a typed value shows is still refused before anything is written: the trainer's
// own checks of its options (here --resume with --restart), naming both.
TEST_F(TrainLibrary, ContradictoryOptionsAreRefusedBeforeAnythingIsWritten) {
  train::RunStart start;
  start.tc = config(p("runs/lib"));
  expect_input_error([&] { train::run(train::RunOptions{.resume = true, .restart = true}, start); },
                     {"--resume and --restart"});
  EXPECT_FALSE(std::filesystem::exists(p("runs/lib")));
}

// A config built by hand whose derived fields disagree with those they derive from is
// refused, naming the field and what it should hold, before anything is written.
TEST_F(TrainLibrary, AConfigWhoseFieldsDisagreeIsRefusedNamingTheField) {
  train::RunStart start;
  start.tc = config(p("runs/lib"));
  start.tc.parallel.step.accum = 3;
  expect_input_error([&] { train::run({}, start); },
                     {"TrainConfig.parallel.step.accum = 3", "training.global_batch / parallel.layout.dp / "
                      "training.micro_batch = 2"});
  start.tc = config(p("runs/lib"));
  start.tc.training.precision = DType::kF16;
  expect_input_error([&] { train::run({}, start); }, {"TrainConfig.parallel.step.fp16 = false: expected true (training.precision = f16)"});
  start.tc = config(p("runs/lib"));
  start.tc.model.kind = "transformer";
  expect_input_error([&] { train::run({}, start); }, {"TrainConfig.model.kind = \"transformer\"", "\"gpt\" or \"mlp\""});
  EXPECT_FALSE(std::filesystem::exists(p("runs/lib")));
}

// A TrainConfig's own fields, left as declared, hold what `loom train` makes of its keys'
// defaults (the fields without one, such as the run directory and the data, aside).
TEST(TrainConfigDefaults, OwnFieldsDefaultAsLoomTrainsKeys) {
  app::Config c;
  c.set("data.train", std::string("train.bin"));
  c.resolve(1);
  const train::TrainConfig cli = app::train_config(c), plain;
#define SAME(field) EXPECT_EQ(plain.field, cli.field) << #field
  SAME(job.seed); SAME(job.log_every); SAME(job.mem_limit_mb); SAME(job.cuda); SAME(job.gemm);
  SAME(job.gemm_path);
  SAME(data.val); SAME(data.tokenizer); SAME(data.hash_shards); SAME(data.document_windows);
  SAME(data.prefetch); SAME(data.cache_mb); SAME(data.fetch_retries);
  SAME(training.eval_every); SAME(training.eval_steps); SAME(training.recompute); SAME(training.precision);
  SAME(training.precision_name); SAME(training.keep_zeros); SAME(training.teacher);
  SAME(training.distill_alpha); SAME(training.distill_temperature);
  SAME(parallel.layout.pp); SAME(parallel.layout.v); SAME(parallel.layout.tp); SAME(parallel.zero);
  SAME(parallel.deterministic); SAME(parallel.sequence_parallel); SAME(parallel.pp_schedule);
  SAME(parallel.step.pp_schedule); SAME(parallel.ps.servers); SAME(parallel.ps.mode);
  SAME(parallel.ps.hierarchical); SAME(parallel.ps.staleness);
  SAME(comm.transport); SAME(comm.timeout_s);
  SAME(checkpoint.own_dir); SAME(checkpoint.keep); SAME(checkpoint.every); SAME(checkpoint.every_s);
  SAME(checkpoint.grace_s); SAME(checkpoint.async); SAME(checkpoint.sigterm_exit_code);
  SAME(profile.trace_steps);
  SAME(metrics.port); SAME(metrics.host); SAME(metrics.every_rank); SAME(metrics.peak_gflops);
  SAME(debug.fault_at); SAME(debug.delay_ms); SAME(debug.jitter_ms);
#undef SAME
}

}  // namespace
}  // namespace loom
