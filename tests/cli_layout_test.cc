// The loom binary end to end on every parallel layout: data, pipeline, tensor and sequence
// parallelism train like one process (bitwise where the layout is deterministic) and
// resume, a rank over its memory budget stops the job, impossible layouts are refused
// before anything starts, and traces show each layout's schedule and collectives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/data/data.h"
#include "loom/core/fileio.h"
#include "cli_fixture.h"
#include "loom_testing.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

TEST_F(Cli, DeterministicDataParallelEqualsOneProcess) {
  // Validation of 3 batches: the replicas split them (2 and 1; the second replica runs its
  // batch twice and keeps one, so that under ZeRO 3 it joins the first's gathers).
  const std::string det = " --quiet --parallel.deterministic=true --checkpoint.every=0 --training.eval_steps=3";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), det, " --job.name=one")).code, 0);
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det,
                      " --job.name=two --parallel.zero=2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("data parallel: 2 ranks"), std::string::npos) << r.out;
  auto one = loss_columns(read_file(p("runs/one/metrics.jsonl")));
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(one, loss_columns(read_file(p("runs/two/metrics.jsonl"))));
  EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), checkpoint::Part::kModel),
            logical(p("runs/two/checkpoints/step_6"), checkpoint::Part::kModel));
  EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), checkpoint::Part::kOptimizer),
            logical(p("runs/two/checkpoints/step_6"), checkpoint::Part::kOptimizer));
  // ZeRO-3: parameters gathered block by block, evaluation and checkpoints still whole.
  r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det, " --job.name=z3 --parallel.zero=3"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(one, loss_columns(read_file(p("runs/z3/metrics.jsonl"))));
  const std::vector<std::string> val = column(read_file(p("runs/one/metrics.jsonl")), "val_loss");
  EXPECT_FALSE(val.empty());
  EXPECT_EQ(val, column(read_file(p("runs/z3/metrics.jsonl")), "val_loss"));
  EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), checkpoint::Part::kModel),
            logical(p("runs/z3/checkpoints/step_6"), checkpoint::Part::kModel));
  EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), checkpoint::Part::kOptimizer),
            logical(p("runs/z3/checkpoints/step_6"), checkpoint::Part::kOptimizer));
}

// Pipeline stages as processes: deterministic pp = 2 with full activation recompute (and
// dp x pp = 2 x 2 with ZeRO 1, the zero-bubble schedule and selective recompute)
// gives the losses, validation losses and checkpoints (weights and optimizer state) of one
// process, bit for bit; a resume on the pipeline layout continues bitwise.
TEST_F(Cli, DeterministicPipelineEqualsOneProcessAndResumes) {
  const std::string det = " --quiet --parallel.deterministic=true --training.micro_batch=1";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), det, " --job.name=one")).code, 0);
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det,
                      " --job.name=pp --parallel.pp=2 --parallel.pp_schedule=gpipe --training.steps=3 --training.recompute=full"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det,
               " --job.name=pp --parallel.pp=2 --parallel.pp_schedule=gpipe --resume --training.recompute=full"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det,
               " --job.name=mesh --parallel.pp=2 --parallel.zero=1 --parallel.pp_schedule=zb-h1 --training.recompute=selective"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string one = read_file(p("runs/one/metrics.jsonl"));
  ASSERT_EQ(loss_columns(one).size(), 6u);
  for (const char* run : {"pp", "mesh"}) {
    const std::string got = read_file(p(cat("runs/", run, "/metrics.jsonl")));
    EXPECT_EQ(loss_columns(one), loss_columns(got)) << run;
    EXPECT_EQ(column(one, "val_loss"), column(got, "val_loss")) << run;
    EXPECT_EQ(column(got, "pp_bubble").size(), 6u) << run;
    EXPECT_EQ(column(got, "pp_wait_ms").size(), 6u) << run;
    EXPECT_EQ(column(got, "pp_comm_ms").size(), 6u) << run;
    // Stage 0 (rank 0) sends each of its micro-batches' activations, 1 x 64 x 64 floats: 4
    // micro-batches a step (global batch 4) on pp = 2, 2 on each replica of dp x pp = 2 x 2.
    const int64_t microbatches = std::string(run) == "pp" ? 4 : 2;
    EXPECT_EQ(column(got, "pp_comm_bytes"), std::vector<std::string>(6, std::to_string(microbatches * 64 * 64 * 4))) << run;
    for (checkpoint::Part part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
      EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), part), logical(p(cat("runs/", run, "/checkpoints/step_6")), part))
          << run << " " << static_cast<int>(part);
  }
}

// Tensor parallelism as processes: tp = 2 (and dp x tp = 2 x 2 with ZeRO 1, and pp x tp =
// 2 x 2) trains like one process: losses, gradient norms and validation losses within 1e-4 (the pieces' sums
// add the heads' and the MLP's partial products in another order than one matrix product
// does; docs/parallelism.md). Checkpoints hold the logical tensors: `loom eval` reads them in
// one process, and a resume on tp = 2 continues bit for bit.
TEST_F(Cli, TensorParallelTrainsLikeOneProcessAndResumes) {
  const std::string common = " --training.micro_batch=2 --training.eval_every=3 --checkpoint.every=3";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --quiet --job.name=one")).code, 0);
  const std::string tp2 = cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common, " --parallel.tp=2");
  Result r = loom(cat(tp2, " --job.name=tp"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Each piece's model state is what the memory plan says.
  const Result plan = loom(cat("train ", p("nano.toml"), " --dry-run --parallel.tp=2 --parallel.dp=1 --training.micro_batch=2"));
  ASSERT_EQ(plan.code, 0) << plan.err;
  const std::string said = r.out + r.err;
  for (const char* part : {"parameters ", "gradients ", "optimizer "}) {
    const double planned = figure_after(plan.out, part), measured = figure_after(said.substr(said.find("model state per rank")), part);
    EXPECT_NEAR(measured, planned, 0.02 * planned + 0.01) << part << "\n" << plan.out << said;
  }
  r = loom(cat(tp2, " --quiet --job.name=tpr --training.steps=3"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat(tp2, " --quiet --job.name=tpr --resume"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common, " --quiet",
               " --job.name=mesh --parallel.tp=2 --parallel.dp=2 --parallel.zero=1"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common, " --quiet",
               " --job.name=mesh3d --parallel.tp=2 --parallel.pp=2 --parallel.zero=1"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string one = read_file(p("runs/one/metrics.jsonl"));
  ASSERT_EQ(column(one, "loss").size(), 6u);
  for (const char* run : {"tp", "mesh", "mesh3d"})
    expect_columns_near(one, read_file(p(cat("runs/", run, "/metrics.jsonl"))), {"loss", "grad_norm", "val_loss"}, 1e-4, run);
  const std::string tp = read_file(p("runs/tp/metrics.jsonl")), tpr = read_file(p("runs/tpr/metrics.jsonl"));
  EXPECT_EQ(loss_columns(tp), loss_columns(tpr));
  // Per micro-batch (2 a step: global_batch 4), two all-reduces per block (2) in forward and
  // two in backward, and the vocab-parallel ends': the embedding's sum, the loss's max and
  // sums, the head's dx.
  EXPECT_EQ(column(tp, "tp_comm_calls"), std::vector<std::string>(6, "24"));
  const auto tp_ms = column(tp, "tp_comm_ms"), exposed_ms = column(tp, "tp_exposed_comm_ms");
  ASSERT_EQ(exposed_ms.size(), tp_ms.size());
  for (size_t i = 0; i < tp_ms.size(); ++i) EXPECT_LE(std::stod(exposed_ms[i]), std::stod(tp_ms[i])) << "step " << i + 1;
  for (checkpoint::Part part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
    EXPECT_EQ(logical(p("runs/tp/checkpoints/step_6"), part), logical(p("runs/tpr/checkpoints/step_6"), part))
        << static_cast<int>(part);
  r = loom(cat("eval --checkpoint ", p("runs/tp/checkpoints/step_6"), " --data ", p("val.bin")));
  ASSERT_EQ(r.code, 0) << r.err;
  const Result whole = loom(cat("eval --checkpoint ", p("runs/one/checkpoints/step_6"), " --data ", p("val.bin")));
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_NEAR(figure_after(r.out, "\"loss\": "), figure_after(whole.out, "\"loss\": "), 1e-4) << r.out << whole.out;
}

// Sequence parallelism (tp = 2, dp x tp = 2 x 2 with ZeRO 2 and pp x tp = 2 x 2, whose
// stages pass only each piece's rows) trains like one process
// within the tensor-parallel tolerance and resumes bit for bit; its collectives are
// all-gathers and reduce-scatters (and the LayerNorms' gradient sums), and the memory plan
// gives each rank fewer activation bytes than tensor parallelism alone.
TEST_F(Cli, SequenceParallelTrainsLikeOneProcessAndResumes) {
  const std::string common = " --quiet --training.micro_batch=2 --training.eval_every=3 --checkpoint.every=3";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --job.name=one")).code, 0);
  const std::string sp = " --parallel.tp=2 --parallel.sequence_parallel=true";
  auto launch = [&](int n, const std::string& flags) {
    return loom(cat("launch -n ", n, " -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common, sp, flags));
  };
  for (const auto& [n, flags] : std::vector<std::pair<int, std::string>>{
           {2, " --job.name=sp"}, {4, " --job.name=spdp --parallel.dp=2 --parallel.zero=2"},
           {4, " --job.name=sppp --parallel.pp=2 --parallel.zero=1"},
           {2, " --job.name=spr --training.steps=3"}, {2, " --job.name=spr --resume"}}) {
    const Result r = launch(n, flags);
    ASSERT_EQ(r.code, 0) << flags << "\n" << r.out << r.err;
  }
  const std::string one = read_file(p("runs/one/metrics.jsonl")), got = read_file(p("runs/sp/metrics.jsonl"));
  for (const char* run : {"sp", "spdp", "sppp"})
    expect_columns_near(one, read_file(p(cat("runs/", run, "/metrics.jsonl"))), {"loss", "grad_norm", "val_loss"}, 1e-4, run);
  EXPECT_EQ(loss_columns(got), loss_columns(read_file(p("runs/spr/metrics.jsonl"))));
  // Stage 0 sends each micro-batch's activations as its piece's rows: 2 x 64 / 2 rows of 64
  // floats, for the 2 micro-batches of a step, half of what a stage sends without it.
  EXPECT_EQ(column(read_file(p("runs/sppp/metrics.jsonl")), "pp_comm_bytes"), std::vector<std::string>(6, "32768"));
  // Per micro-batch (2 a step) and block (2): forward gathers c_attn's and c_fc's inputs and
  // reduce-scatters both c_proj outputs (4); backward gathers both c_proj's dy, gathers
  // c_attn's and c_fc's inputs again and reduce-scatters their dx (6), and sums ln_1's and
  // ln_2's gradients (2). The ends: the embedding's reduce-scatter, ln_f's gather, the loss's
  // max and sum, the head's reduce-scatter, ln_f's gradient sum, backward_embed's gather (7).
  EXPECT_EQ(column(got, "tp_comm_calls"), std::vector<std::string>(6, std::to_string(2 * (2 * 12 + 7))));
  auto activations = [&](const std::string& flags) {
    const Result plan = loom(cat("train ", p("nano.toml"), " --dry-run --parallel.tp=2 --parallel.dp=1 --training.micro_batch=2",
                                 flags));
    EXPECT_EQ(plan.code, 0) << plan.err;
    return figure_after(plan.out, "activations ");
  };
  EXPECT_LT(activations(" --parallel.sequence_parallel=true"), activations(""));
}

// bf16 gradient communication on model-parallel meshes (the sums over replicas of each
// stage's and piece's gradients in bf16): the losses stay within 2% of one process in f32,
// as on data parallelism alone (docs/parallelism.md, "Mixed-precision communication").
TEST_F(Cli, Bf16GradientsOnTheMeshStayCloseToF32) {
  const std::string common = " --quiet --training.micro_batch=1 --training.eval_every=0 --checkpoint.every=0";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --job.name=one")).code, 0);
  const auto want = column(read_file(p("runs/one/metrics.jsonl")), "loss");
  for (const std::string layout : {" --parallel.dp=2 --parallel.tp=2", " --parallel.dp=2 --parallel.pp=2 --parallel.zero=1",
                                   " --parallel.dp=2 --parallel.tp=2 --parallel.zero=2 --parallel.sequence_parallel=true"}) {
    const Result r = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common, layout,
                              " --comm.grad_dtype=bf16 --job.name=bf16"));
    ASSERT_EQ(r.code, 0) << layout << "\n" << r.out << r.err;
    const auto have = column(read_file(p("runs/bf16/metrics.jsonl")), "loss");
    ASSERT_EQ(have.size(), want.size()) << layout;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(std::stod(have[i]), std::stod(want[i]), 0.02 * std::stod(want[i])) << layout << " at step " << i + 1;
    std::filesystem::remove_all(p("runs/bf16"));
  }
}

// Layouts over dp, pp and tp in {1, 2, 4} up to 8 ranks, and 3 ranks on the tp axis, each
// against one process training the same model on the same global batch: losses and
// gradient norms within 1e-4 (tp's sums in another order; docs/parallelism.md).
TEST_F(Cli, EveryMeshLayoutTrainsLikeOneProcess) {
  struct Layout {
    int dp, pp, tp;
    std::string model;  // n_head divisible by tp
  };
  const std::string four_heads = " --model.n_head=4 --model.n_layer=4", three_heads = " --model.n_head=3 --model.d_model=48 --model.vocab_size=258";
  const std::vector<Layout> layouts = {{1, 1, 4, four_heads}, {2, 1, 4, four_heads}, {1, 2, 4, four_heads},
                                       {1, 4, 2, four_heads}, {2, 2, 2, four_heads}, {4, 1, 2, four_heads},
                                       {1, 1, 3, three_heads}, {2, 1, 3, three_heads}};
  const std::string common = " --quiet --training.steps=4 --training.global_batch=8 --training.micro_batch=1 "
                             "--training.eval_every=0 --checkpoint.every=0 --job.threads=1";
  std::map<std::string, std::string> reference;  // model flags -> one process's metrics
  for (const std::string& model : {four_heads, three_heads}) {
    const std::string name = cat("one", reference.size());
    ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, model, " --job.name=", name)).code, 0);
    reference[model] = read_file(p(cat("runs/", name, "/metrics.jsonl")));
  }
  for (const Layout& l : layouts) {
    const std::string name = cat("dp", l.dp, "pp", l.pp, "tp", l.tp);
    Result r = loom(cat("launch -n ", l.dp * l.pp * l.tp, " -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common,
                        l.model, " --job.name=", name, " --parallel.dp=", l.dp, " --parallel.pp=", l.pp, " --parallel.tp=", l.tp));
    ASSERT_EQ(r.code, 0) << name << "\n" << r.out << r.err;
    const std::string got = read_file(p(cat("runs/", name, "/metrics.jsonl")));
    ASSERT_EQ(column(got, "loss").size(), 4u) << name;
    expect_columns_near(reference[l.model], got, {"loss", "grad_norm"}, 1e-4, name);
  }
}

// [job] mem_limit_mb: a rank over its budget stops the run with a line naming it.
TEST_F(Cli, MemoryLimitStopsARankOverItsBudget) {
  Result r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=mem --job.mem_limit_mb=1"));
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  for (const char* f : {"rank 0 at step 1: used ", "MiB at its peak, over job.mem_limit_mb = 1 MiB per rank"})
    EXPECT_NE(r.err.find(f), std::string::npos) << f << " in " << r.err;
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=mem2 --job.mem_limit_mb=4000 --training.steps=2")).code, 0);
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=mem3 --job.mem_limit_mb=-5"), {"job.mem_limit_mb", ">= 0"});
}

TEST_F(Cli, ImpossibleLayoutsAreRefusedBeforeAnythingStarts) {
  const std::string cfg = cat("train ", p("nano.toml"), " --job.name=fresh");
  expect_bad_input(cat(cfg, " --parallel.pp=2"), {"parallel.dp x parallel.tp x parallel.pp = 0 x 1 x 2", "the job has 1 rank"});
  expect_bad_input(cat(cfg, " --parallel.pp=3 --parallel.dp=1"), {"1 x 1 x 3 = 3", "the job has 1 rank"});
  // The rest against a world of 2: each rank refuses before it joins the others.
  const std::string two = cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom ", cfg);
  for (const auto& [flags, fragments] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {" --parallel.pp=2 --model.n_layer=3", {"model.n_layer = 3", "not divisible", "2 x 1 = 2"}},
           {" --parallel.pp=2 --parallel.zero=3", {"parallel.zero", "ZeRO-3", "parallel.pp = 2"}},
           {" --parallel.pp=2 --parallel.virtual_stages=2", {"parallel.virtual_stages", "= 2: several chunks per stage", "interleaved"}},
           {" --parallel.pp=2 --model.n_layer=4 --parallel.pp_schedule=interleaved --parallel.virtual_stages=2 "
            "--training.global_batch=3 --training.micro_batch=1",
            {"3 micro-batches", "interleaved", "multiple of 2"}},
           {" --parallel.pp=2 --parallel.pp_schedule=zb-h1 --training.recompute=full", {"training.recompute", "zb-h1"}},
           {" --parallel.pp=2 --parallel.microbatches=3", {"parallel.microbatches", "= 3: a step has", "expected 2 or 0"}},
           {" --parallel.pp=2 --model.preset=mlp --data.train=fashion-mnist", {"parallel.pp", "not a GPT"}},
           {" --parallel.tp=2 --model.preset=mlp --data.train=fashion-mnist", {"parallel.tp", "not a GPT"}},
           {" --parallel.tp=2 --model.n_head=1", {"model.n_head = 1", "not divisible among parallel.tp = 2"}},
           {" --parallel.tp=2 --model.vocab_size=255", {"model.vocab_size = 255", "not divisible among parallel.tp = 2"}},
           {" --parallel.sequence_parallel=true", {"parallel.sequence_parallel", "parallel.tp = 1"}},
           {" --parallel.tp=2 --parallel.pp=1 --parallel.sequence_parallel=true --training.micro_batch=1 --model.seq_len=63",
            {"training.micro_batch x model.seq_len = 1 x 63 = 63 rows", "not divisible among parallel.tp = 2"}},
       }) {
    Result r = loom(cat(two, flags));
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.out << r.err;
    const std::string said = r.out + r.err;  // the launcher prefixes each rank's lines
    for (const auto& f : fragments) EXPECT_NE(said.find(f), std::string::npos) << "missing '" << f << "' in: " << said;
  }
  const Result staged = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom ", cfg,
                                 " --parallel.tp=2 --parallel.pp=2 --parallel.sequence_parallel=true --parallel.pp_schedule=zb-h1"));
  EXPECT_EQ(staged.code, 2) << staged.out << staged.err;
  EXPECT_NE((staged.out + staged.err).find("= true with parallel.pp_schedule = \"zb-h1\": the deferred"), std::string::npos)
      << staged.out << staged.err;
  // Ranks started with different layouts (each valid alone) are named and refused at start.
  write(p("differ.sh"), cat("#!/bin/sh\nif [ \"$RANK\" = 1 ]; then set -- --parallel.dp=2; else set -- --parallel.pp=2; fi\n",
                            "exec ", LOOM_BINARY_DIR, "/loom ", cfg, " --quiet \"$@\"\n"));
  ASSERT_EQ(::chmod(p("differ.sh").c_str(), 0755), 0);
  Result r = loom(cat("launch -n 2 -- ", p("differ.sh")));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  for (const char* f : {"rank 1 was started with the layout \"dp=2 tp=1 pp=1", "but rank 0 with \"dp=1 tp=1 pp=2"})
    EXPECT_NE((r.out + r.err).find(f), std::string::npos) << f << " in " << r.out << r.err;
  EXPECT_FALSE(fs::exists(p("runs/fresh"))) << "a refused job wrote its run directory";
}

// job.gemm_path from the command line: training on the generic micro-kernel with 2 threads
// gives the same losses and weights, bit for bit, as the widest one with 1 thread (Loom's
// GEMM fixes its order of arithmetic: docs/numerics.md). job.gemm = "openblas" trains too;
// bad values are refused by name.

TEST_F(Cli, TraceOfPipelineStepsShowsTheSchedule) {
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --job.name=pptrace --training.steps=3 --profile.trace_steps=2 --checkpoint.every=0 "
                      "--parallel.pp=2 --training.micro_batch=1"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto trace = nlohmann::json::parse(read_file(p("runs/pptrace/trace.json")));
  std::map<int, std::vector<std::tuple<double, double, std::string>>> spans;  // rank -> (begin, end, name)
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("tid") == 0)
      spans[e.at("pid").get<int>()].emplace_back(e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>(),
                                                 e.at("name").get<std::string>());
  int waits = 0;  // a pipeline waits somewhere (how long where depends on the machine's load)
  for (int stage : {0, 1}) {
    auto& list = spans[stage];
    std::sort(list.begin(), list.end());
    double pipeline_begin = -1, pipeline_end = -1, last_compute_end = 0;
    std::map<std::string, int> count;
    for (const auto& [b, e, name] : list) {
      ++count[name];
      if (name == cat("pipeline 1f1b, stage ", stage)) pipeline_begin = b, pipeline_end = e;
      if (!name.starts_with("forward mb") && !name.starts_with("backward mb")) continue;
      EXPECT_GE(b + 0.002, last_compute_end) << "stage " << stage << ": " << name << " overlaps the compute before it";
      EXPECT_TRUE(b + 0.002 >= pipeline_begin && e <= pipeline_end + 0.002) << name << " outside the pipeline span";
      last_compute_end = e;
    }
    for (int mb = 0; mb < 4; ++mb)
      for (const char* op : {"forward", "backward"}) EXPECT_EQ(count[cat(op, " mb ", mb)], 1) << "stage " << stage << " " << op << mb;
    // Waits name the neighbour they wait for.
    for (const auto& [name, n] : count)
      if (name.starts_with("wait: activations") || name.starts_with("wait: gradients of")) {
        ++waits;
        EXPECT_TRUE(name.find(stage == 0 ? "from stage 1 (rank 1)" : "from stage 0 (rank 0)") != std::string::npos) << name;
      }
  }
  EXPECT_GT(waits, 0) << "no stage ever waited for a neighbour";
}

// A tensor-parallel step's trace shows every seam all-reduce on the communication track (and
// the training thread's wait for it), as many and as many bytes as the step's metrics say.
TEST_F(Cli, TraceOfTensorParallelStepShowsItsAllReduces) {
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --job.name=tptrace --training.steps=3 --profile.trace_steps=2 --checkpoint.every=0 "
                      "--parallel.tp=2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto trace = nlohmann::json::parse(read_file(p("runs/tptrace/trace.json")));
  const std::string metrics = read_file(p("runs/tptrace/metrics.jsonl"));
  for (int rank : {0, 1}) {
    int64_t calls = 0, bytes = 0, waits = 0;
    for (const auto& e : trace.at("traceEvents")) {
      if (e.at("ph") != "X" || e.at("pid").get<int>() != rank) continue;
      const std::string name = e.at("name");
      if (e.at("tid") == 1 && name.starts_with("tp all-reduce")) ++calls, bytes += e.at("args").at("bytes").get<int64_t>();
      if (e.at("tid") == 0 && name.starts_with("wait: tp all-reduce")) ++waits;
    }
    if (rank == 0) {  // rank 0's metrics; every piece makes the same calls
      EXPECT_EQ(cat(calls), column(metrics, "tp_comm_calls")[1]);
      EXPECT_EQ(cat(bytes), column(metrics, "tp_comm_bytes")[1]);
    }
    EXPECT_EQ(calls, 24) << "rank " << rank;  // as in TensorParallelTrainsLikeOneProcessAndResumes
    EXPECT_EQ(waits, calls) << "rank " << rank;
  }
}

TEST_F(Cli, TraceOfChosenStepsMergesEveryRank) {
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --job.name=traced --training.steps=5 --profile.trace_steps=2,4 --checkpoint.every=0"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto trace = nlohmann::json::parse(read_file(p("runs/traced/trace.json")));
  struct Span {
    std::string name;
    double ts, end;
    int64_t bytes;
  };
  std::map<std::pair<int, int>, std::vector<Span>> tracks;  // (rank, track)
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts").get<double>();
    tracks[{e.at("pid").get<int>(), e.at("tid").get<int>()}].push_back(
        {e.at("name").get<std::string>(), ts, ts + e.at("dur").get<double>(),
         e.contains("args") ? e.at("args").at("bytes").get<int64_t>() : 0});
  }
  const std::vector<std::string> comm_bytes = column(read_file(p("runs/traced/metrics.jsonl")), "comm_bytes");
  ASSERT_EQ(comm_bytes.size(), 5u);
  for (int rank : {0, 1}) {
    auto& training = tracks[{rank, 0}];
    std::sort(training.begin(), training.end(), [](const Span& a, const Span& b) { return a.ts < b.ts || (a.ts == b.ts && a.end > b.end); });
    std::map<std::string, int> count;
    std::map<std::string, std::set<std::string>> parents;  // of each span name, where it nests
    std::vector<const Span*> stack;
    for (const Span& s : training) {
      ++count[s.name];
      while (!stack.empty() && stack.back()->end <= s.ts + 0.002) stack.pop_back();
      if (!stack.empty()) {
        EXPECT_LE(s.end, stack.back()->end + 0.002) << "rank " << rank << ": " << s.name << " overlaps " << stack.back()->name;
        parents[s.name].insert(stack.back()->name.substr(0, stack.back()->name.find(" block")));
      }
      stack.push_back(&s);
    }
    // The layers' parts (loom/nn/step_breakdown.h), each inside its block's span (a weight
    // gradient's inside its input gradient's, a LayerNorm's inside the fused one that calls
    // it), or for the embedding, head and loss inside forward or backward (the loss's forward
    // after forward's span, in its micro-step's; ln_f's and the loss's backward inside the head's).
    const std::map<std::string, std::set<std::string>> where = {
        {"linear_fwd", {"forward"}},          {"attn_fwd", {"forward"}},
        {"norm_fwd", {"forward", "norm_fwd"}}, {"linear_dx", {"backward"}},
        {"linear_dw", {"linear_dx"}},          {"attn_bwd", {"backward"}},
        {"norm_bwd", {"backward", "edges_bwd"}}, {"edges_fwd", {"forward", "edges_fwd", "micro-step 0"}},
        {"edges_bwd", {"backward", "edges_bwd"}}};
    for (const auto& [name, allowed] : where) {
      EXPECT_GE(count[name], name.starts_with("edges") ? 2 : 4) << "rank " << rank << ": " << name;  // 2 blocks, 2 steps
      EXPECT_EQ(parents[name], allowed) << "rank " << rank << ": " << name;
    }
    for (const char* name : {"step 2", "step 4"}) EXPECT_EQ(count[name], 1) << rank << " " << name;
    EXPECT_EQ(count["step 1"] + count["step 3"] + count["step 5"], 0);
    for (const char* name : {"forward block 0", "forward block 1", "backward block 1", "backward block 0", "optimizer step"})
      EXPECT_EQ(count[name], 2) << "rank " << rank << ": " << name;  // nano: 1 micro-step per step
    if (rank != 0) continue;
    for (const Span& step : training) {
      if (!step.name.starts_with("step ")) continue;
      int64_t bytes = 0, reduces = 0;
      for (const Span& s : tracks[{0, 1}]) {
        if (s.ts < step.ts || s.end > step.end) continue;
        bytes += s.bytes;
        reduces += s.name.starts_with("all-reduce gradients");
      }
      EXPECT_GE(reduces, 1);
      EXPECT_EQ(cat(bytes), comm_bytes[std::stoi(step.name.substr(5)) - 1]) << step.name;
    }
  }
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=t9 --profile.trace_steps=9"),
                   {"profile.trace_steps", "past training.steps = 6"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=t9 --profile.trace_steps=2-x"),
                   {"profile.trace_steps", "expected steps"});
}

}  // namespace
}  // namespace loom
