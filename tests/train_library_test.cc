// The trainer as a library (loom/train/train.h): a C++ program that builds a TrainConfig
// itself and calls train::run in its own process trains as `loom train` does from the same
// settings in a TOML file: the same losses and gradient norms, bit for bit, and the same
// run directory (metrics, checkpoints).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "config.h"
#include "config_train.h"
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
  EXPECT_EQ(plain.job.seed, cli.job.seed);
  EXPECT_EQ(plain.job.log_every, cli.job.log_every);
  EXPECT_EQ(plain.job.mem_limit_mb, cli.job.mem_limit_mb);
  EXPECT_EQ(plain.job.cuda, cli.job.cuda);
  EXPECT_EQ(plain.data.val, cli.data.val);
  EXPECT_EQ(plain.data.tokenizer, cli.data.tokenizer);
  EXPECT_EQ(plain.data.hash_shards, cli.data.hash_shards);
  EXPECT_EQ(plain.data.document_windows, cli.data.document_windows);
  EXPECT_EQ(plain.data.prefetch, cli.data.prefetch);
  EXPECT_EQ(plain.data.cache_mb, cli.data.cache_mb);
  EXPECT_EQ(plain.data.fetch_retries, cli.data.fetch_retries);
  EXPECT_EQ(plain.training.eval_every, cli.training.eval_every);
  EXPECT_EQ(plain.training.eval_steps, cli.training.eval_steps);
  EXPECT_EQ(plain.training.recompute, cli.training.recompute);
  EXPECT_EQ(plain.training.precision, cli.training.precision);
  EXPECT_EQ(plain.training.precision_name, cli.training.precision_name);
  EXPECT_EQ(plain.training.keep_zeros, cli.training.keep_zeros);
  EXPECT_EQ(plain.training.teacher, cli.training.teacher);
  EXPECT_EQ(plain.training.distill_alpha, cli.training.distill_alpha);
  EXPECT_EQ(plain.training.distill_temperature, cli.training.distill_temperature);
  EXPECT_EQ(plain.parallel.layout.pp, cli.parallel.layout.pp);
  EXPECT_EQ(plain.parallel.layout.v, cli.parallel.layout.v);
  EXPECT_EQ(plain.parallel.layout.tp, cli.parallel.layout.tp);
  EXPECT_EQ(plain.parallel.zero, cli.parallel.zero);
  EXPECT_EQ(plain.parallel.deterministic, cli.parallel.deterministic);
  EXPECT_EQ(plain.parallel.sequence_parallel, cli.parallel.sequence_parallel);
  EXPECT_EQ(plain.parallel.pp_schedule, cli.parallel.pp_schedule);
  EXPECT_EQ(plain.parallel.step.pp_schedule, cli.parallel.step.pp_schedule);
  EXPECT_EQ(plain.parallel.ps.servers, cli.parallel.ps.servers);
  EXPECT_EQ(plain.parallel.ps.mode, cli.parallel.ps.mode);
  EXPECT_EQ(plain.parallel.ps.hierarchical, cli.parallel.ps.hierarchical);
  EXPECT_EQ(plain.parallel.ps.staleness, cli.parallel.ps.staleness);
  EXPECT_EQ(plain.comm.transport, cli.comm.transport);
  EXPECT_EQ(plain.comm.timeout_s, cli.comm.timeout_s);
  EXPECT_EQ(plain.checkpoint.own_dir, cli.checkpoint.own_dir);
  EXPECT_EQ(plain.checkpoint.keep, cli.checkpoint.keep);
  EXPECT_EQ(plain.checkpoint.every, cli.checkpoint.every);
  EXPECT_EQ(plain.checkpoint.every_s, cli.checkpoint.every_s);
  EXPECT_EQ(plain.checkpoint.grace_s, cli.checkpoint.grace_s);
  EXPECT_EQ(plain.checkpoint.async, cli.checkpoint.async);
  EXPECT_EQ(plain.checkpoint.sigterm_exit_code, cli.checkpoint.sigterm_exit_code);
  EXPECT_EQ(plain.profile.trace_steps, cli.profile.trace_steps);
  EXPECT_EQ(plain.metrics.port, cli.metrics.port);
  EXPECT_EQ(plain.metrics.host, cli.metrics.host);
  EXPECT_EQ(plain.metrics.every_rank, cli.metrics.every_rank);
  EXPECT_EQ(plain.metrics.peak_gflops, cli.metrics.peak_gflops);
  EXPECT_EQ(plain.debug.fault_at, cli.debug.fault_at);
  EXPECT_EQ(plain.debug.delay_ms, cli.debug.delay_ms);
  EXPECT_EQ(plain.debug.jitter_ms, cli.debug.jitter_ms);
}

}  // namespace
}  // namespace loom
