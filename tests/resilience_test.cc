// Checkpoints across layouts and failures, end to end (docs/formats.md, "Checkpoint
// directories"): a run saved on one layout resumes on another and continues as an
// uninterrupted run would.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/fileio.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

struct Layout {
  int ranks;
  std::string flags;
  bool tp() const { return flags.find("parallel.tp=") != std::string::npos; }
};

// Train 3 of 6 steps on layout A, save, resume on layout B to the end, and compare with one
// process training all 6 (which, in deterministic mode, every dp/ZeRO/pp layout equals bit
// for bit): the losses, gradient norms and validation losses of every step and the final
// weights and optimizer state, bitwise when neither layout has tp, within the
// tensor-parallel tolerance (1e-4, docs/parallelism.md) when one does. The sample order
// continues too: a repeated or skipped sample would change the losses.
TEST_F(Cli, CheckpointsResumeOnAnyOtherLayout) {
  const std::string common = " --quiet --parallel.deterministic=true --training.micro_batch=1";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --job.name=one")).code, 0);
  const std::string one = read_file(p("runs/one/metrics.jsonl"));
  const Layout single{1, ""}, dp2z1{2, " --parallel.dp=2 --parallel.zero=1"}, dp2z2{2, " --parallel.dp=2 --parallel.zero=2"},
      dp4z3{4, " --parallel.dp=4 --parallel.zero=3"}, dp2z0{2, " --parallel.dp=2"},
      pp2{2, " --parallel.pp=2 --parallel.pp_schedule=gpipe"}, pp2_1f1b{2, " --parallel.pp=2"},
      dp2pp2{4, " --parallel.dp=2 --parallel.pp=2 --parallel.zero=1"}, tp2{2, " --parallel.tp=2"},
      dp2tp2{4, " --parallel.dp=2 --parallel.tp=2 --parallel.zero=2"},
      pp2tp2{4, " --parallel.pp=2 --parallel.tp=2 --parallel.sequence_parallel=true"};
  const std::vector<std::pair<Layout, Layout>> pairs = {
      {single, dp2z1}, {dp2z1, single}, {dp2z2, dp4z3}, {dp4z3, dp2z0}, {pp2, dp2z2}, {dp2z1, pp2_1f1b},
      {dp2pp2, single}, {single, dp2pp2}, {tp2, single}, {single, tp2}, {tp2, dp2tp2}, {dp2tp2, pp2tp2}, {pp2tp2, pp2}};
  auto train = [&](const Layout& l, const std::string& flags) {
    const std::string cmd = cat("train ", p("nano.toml"), common, l.flags, flags);
    return l.ranks == 1 ? loom(cmd) : loom(cat("launch -n ", l.ranks, " -- ", LOOM_BINARY_DIR, "/loom ", cmd));
  };
  int n = 0;
  for (const auto& [a, b] : pairs) {
    const std::string name = cat("pair", n++), what = cat(name, ":", a.flags, " ->", b.flags);
    Result r = train(a, cat(" --job.name=", name, " --training.steps=3"));
    ASSERT_EQ(r.code, 0) << what << "\n" << r.out << r.err;
    r = train(b, cat(" --job.name=", name, " --resume"));
    ASSERT_EQ(r.code, 0) << what << "\n" << r.out << r.err;
    const std::string got = read_file(p(cat("runs/", name, "/metrics.jsonl")));
    const std::string dir = p(cat("runs/", name, "/checkpoints/step_6"));
    if (!a.tp() && !b.tp()) {
      EXPECT_EQ(loss_columns(one), loss_columns(got)) << what;
      EXPECT_EQ(column(one, "val_loss"), column(got, "val_loss")) << what;
      for (checkpoint::Part part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
        EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), part), logical(dir, part)) << what;
    } else {
      ASSERT_EQ(column(got, "loss").size(), 6u) << what;
      expect_columns_near(one, got, {"loss", "grad_norm", "val_loss"}, 1e-4, what);
    }
    // The layout that wrote the last checkpoint is recorded in it.
    EXPECT_EQ(checkpoint::Checkpoint::open(dir).layout()["world"], b.ranks) << what;
  }
}

// `loom ckpt verify | inspect | export` on a checkpoint two tensor-parallel ranks wrote, and
// `loom train --init-from` of the export on other layouts.
TEST_F(Cli, CkptCommandsAndInitFromWorkOnAnyLayout) {
  const std::string common = " --quiet --parallel.deterministic=true --training.micro_batch=1";
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common,
                      " --job.name=tp --parallel.tp=2 --training.steps=3"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = loom(cat("ckpt verify ", p("runs/tp")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("every file's size and SHA-256"), std::string::npos) << r.out;
  r = loom(cat("ckpt inspect ", p("runs/tp")));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {"step 3, optimizer steps 3", "\"tp\":2", "file model-00001.safetensors",
                           "tensor model transformer.h.0.attn.c_attn.weight F32 [64, 192]",
                           "tensor optimizer exp_avg.transformer.wte.weight F32 [256, 64]"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " missing from:\n" << r.out;
  // The export holds every logical tensor whole, under its Hugging Face name.
  r = loom(cat("ckpt export ", p("runs/tp"), " --out ", p("w.safetensors")));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string exported = logical(p("w.safetensors"), checkpoint::Part::kModel);
  EXPECT_EQ(exported, logical(p("runs/tp/checkpoints/step_3"), checkpoint::Part::kModel));
  if (testing::python_unusable().empty()) {  // a reader that is not Loom's
    auto [code, out] = testing::run_command(cat(testing::kPython, " ", LOOM_SOURCE_DIR, "/tools/read_safetensors.py ",
                                                p("w.safetensors"), " 2>&1"));
    ASSERT_EQ(code, 0) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4 + 12 * 2) << out;  // wte, wpe, ln_f (2); 12 per block
    EXPECT_NE(out.find("transformer.h.1.attn.c_attn.weight float32 [64, 192]"), std::string::npos) << out;
  }
  // Training from the export: one process and dp x pp = 2 x 2 take the same steps.
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --job.name=i1 --init-from ", p("w.safetensors"))).code, 0);
  r = loom(cat("launch -n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common,
               " --job.name=i4 --parallel.dp=2 --parallel.pp=2 --init-from ", p("w.safetensors")));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string i1 = read_file(p("runs/i1/metrics.jsonl"));
  EXPECT_EQ(loss_columns(i1), loss_columns(read_file(p("runs/i4/metrics.jsonl"))));
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), common, " --job.name=fresh")).code, 0);
  EXPECT_NE(loss_columns(i1), loss_columns(read_file(p("runs/fresh/metrics.jsonl"))));  // it did start elsewhere
  expect_bad_input(cat("train ", p("nano.toml"), " --resume --init-from ", p("w.safetensors")), {"--resume and --init-from"});
  // A flipped byte in one rank's shard: verify names the file and the tensor, exit 2.
  const std::string shard = p("runs/tp/checkpoints/step_3/model-00001.safetensors");
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 5] ^= 4;
  write(shard, bytes);
  expect_bad_input(cat("ckpt verify ", p("runs/tp")), {"model-00001.safetensors", "SHA-256 mismatch", "in tensor transformer."});
}

// A save on a background thread writes what a synchronous one writes; checkpoint.every_s
// saves on time as well as on steps.
TEST_F(Cli, AsyncAndTimedSavesWriteWhatSyncSavesDo) {
  const std::string common = " --quiet --parallel.deterministic=true --training.micro_batch=1 --checkpoint.keep=0";
  const std::string two = cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), common,
                              " --parallel.dp=2 --parallel.zero=1");
  ASSERT_EQ(loom(cat(two, " --job.name=sync --checkpoint.every=2")).code, 0);
  Result r = loom(cat(two, " --job.name=async --checkpoint.every=2 --checkpoint.async=true"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int step : {2, 4, 6})
    for (checkpoint::Part part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
      EXPECT_EQ(logical(p(cat("runs/sync/checkpoints/step_", step)), part),
                logical(p(cat("runs/async/checkpoints/step_", step)), part))
          << "step " << step;
  const std::string metrics = read_file(p("runs/async/metrics.jsonl"));
  EXPECT_EQ(loss_columns(read_file(p("runs/sync/metrics.jsonl"))), loss_columns(metrics));
  EXPECT_EQ(column(metrics, "ckpt_stall_ms").size(), 2u) << metrics;  // steps 2 and 4's, on lines 3 and 5
  // A microsecond's interval: every step saves, whatever checkpoint.every says.
  r = loom(cat(two, " --job.name=timed --checkpoint.every=0 --checkpoint.every_s=0.000001 --checkpoint.async=true"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int step = 1; step <= 6; ++step)
    EXPECT_TRUE(fs::exists(p(cat("runs/timed/checkpoints/step_", step, "/index.json")))) << step;
  expect_bad_input(cat("train ", p("nano.toml"), " --checkpoint.every_s=-1"), {"checkpoint.every_s", "-1"});
}

// SIGTERM (what Kubernetes and Slurm send before killing), to the launcher or to one rank:
// every rank finishes its step, saves and exits 0 within checkpoint.grace_s, and --resume
// then loses no step: the run ends as an uninterrupted one does, bit for bit.
TEST_F(Cli, SigtermSavesAndResumeLosesNothing) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --parallel.deterministic=true --training.steps=400 --checkpoint.every=0 "
                                "--training.eval_every=0 --parallel.dp=2 --parallel.zero=2");
  ASSERT_EQ(loom(cat("launch -n 2 -- ", train, " --quiet --job.name=full")).code, 0);
  for (const bool to_launcher : {true, false}) {
    const std::string name = to_launcher ? "launcher" : "rank", metrics = p(cat("runs/", name, "/metrics.jsonl"));
    const pid_t launcher = launch_in_background(
        cat("-n 2 -- ", train, " --job.name=", name, to_launcher ? " --checkpoint.async=true" : ""), p(name + ".out"));
    ASSERT_GE(launcher, 0);
    wait_for_lines(metrics, 10);
    const pid_t target = to_launcher ? launcher : rank_pid(launcher, 1);
    ASSERT_GT(target, 0);
    const Ended ended = signal_and_wait(target, SIGTERM, launcher);
    const std::string out = read_file(p(name + ".out"));
    EXPECT_TRUE(WIFEXITED(ended.status) && WEXITSTATUS(ended.status) == 0) << name << ": " << out;
    EXPECT_LT(ended.seconds, 20.0) << name << " exceeded checkpoint.grace_s";
    EXPECT_NE(out.find("SIGTERM: saved step "), std::string::npos) << out;
    // The checkpoint is the last step logged: nothing is lost.
    const int64_t logged = line_count(metrics);
    ASSERT_LT(logged, 400) << name << ": the run ended before the signal";
    EXPECT_EQ(read_file(p(cat("runs/", name, "/checkpoints/latest"))), cat("step_", logged, "\n")) << name;
    const Result r = loom(cat("launch -n 2 -- ", train, " --quiet --job.name=", name, " --resume"));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(loss_columns(read_file(p("runs/full/metrics.jsonl"))), loss_columns(read_file(metrics))) << name;
    EXPECT_EQ(logical(p("runs/full/checkpoints/step_400"), checkpoint::Part::kModel),
              logical(p(cat("runs/", name, "/checkpoints/step_400")), checkpoint::Part::kModel))
        << name;
  }
}

// A crash (SIGKILL) at every point of a save, on the rank that reaches it (debug.fault_at):
// a shard file complete (rank 0 or 1), the state and the index written, the directory
// renamed, `latest` replaced; with synchronous and asynchronous saves. Each time the
// newest checkpoint `latest` names verifies, and --resume from it ends the run as an
// uninterrupted one does, bit for bit.
TEST_F(Cli, CrashAtEveryPointOfASaveLeavesACheckpointToResumeFrom) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --quiet --parallel.deterministic=true --training.micro_batch=1 --checkpoint.every=2 "
                                "--checkpoint.keep=0 --parallel.dp=2 --parallel.zero=1");
  ASSERT_EQ(loom(cat("launch -n 2 -- ", train, " --job.name=full")).code, 0);
  const std::string full = read_file(p("runs/full/metrics.jsonl"));
  struct Crash {
    std::string at;       // debug.fault_at
    std::string flags;    // more training flags
    std::string latest;   // what `latest` names after the crash
  };
  const std::vector<Crash> crashes = {
      {"shard:4:0", "", "step_2"},   {"shard:4:1", "", "step_2"},  {"state:4:0", "", "step_2"},
      {"index:4:0", "", "step_2"},   {"renamed:4:0", "", "step_2"}, {"latest:4:0", "", "step_4"},
      {"shard:4:1", " --checkpoint.async=true", "step_2"}, {"index:4:0", " --checkpoint.async=true", "step_2"}};
  int n = 0;
  for (const Crash& c : crashes) {
    const std::string name = cat("crash", n++), what = c.at + c.flags;
    const Result r = loom(cat("launch -n 2 -- ", train, c.flags, " --job.name=", name, " --debug.fault_at=", c.at));
    EXPECT_NE(r.code, 0) << what << ": the crash did not happen\n" << r.out << r.err;
    if (c.at == "shard:4:1" && c.flags.empty()) {
      // The survivor's line points to its flight recorder, which shows the collective that
      // failed when its peer died.
      const std::string out = r.out + r.err, flight = p(cat("runs/", name, "/logs/flight-rank0.json"));
      EXPECT_NE(out.find(cat("(flight recorder: ", flight, ")")), std::string::npos) << out;
      const nlohmann::json doc = nlohmann::json::parse(read_file(flight));
      EXPECT_EQ(doc["step"], 4);
      const nlohmann::json& ops = doc["communicators"]["world"]["ops"];
      ASSERT_FALSE(ops.empty());
      EXPECT_EQ(ops.back()["state"], "failed") << ops.back();
      EXPECT_NE(ops.back()["op"].get<std::string>().find("all_gather"), std::string::npos) << ops.back();
      EXPECT_NE(ops.back()["error"].get<std::string>().find("rank 1"), std::string::npos) << ops.back();
    }
    const std::string root = p(cat("runs/", name, "/checkpoints"));
    EXPECT_EQ(read_file(root + "/latest"), c.latest + "\n") << what;
    const Result verified = loom(cat("ckpt verify ", p(cat("runs/", name))));
    EXPECT_EQ(verified.code, 0) << what << ": " << verified.err;
    const Result resumed = loom(cat("launch -n 2 -- ", train, c.flags, " --job.name=", name, " --resume"));
    ASSERT_EQ(resumed.code, 0) << what << "\n" << resumed.out << resumed.err;
    EXPECT_EQ(loss_columns(full), loss_columns(read_file(p(cat("runs/", name, "/metrics.jsonl"))))) << what;
    EXPECT_EQ(logical(p("runs/full/checkpoints/step_6"), checkpoint::Part::kOptimizer),
              logical(root + "/step_6", checkpoint::Part::kOptimizer))
        << what;
    // What the crash left half-written is gone once a later save of that step completes.
    for (const auto& e : fs::directory_iterator(root))
      EXPECT_FALSE(e.path().filename().string().starts_with(".step_4")) << what << ": " << e.path();
  }
}

// The steps under a checkpoint root: "step_N" directories as N, and the names of the
// directories set aside (step_N.set-aside-...).
struct Steps {
  std::vector<int64_t> live;
  std::vector<std::string> aside;
};
Steps steps_under(const std::string& root) {
  Steps s;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || !n.starts_with("step_")) continue;
    if (n.find(".set-aside-") != std::string::npos) s.aside.push_back(n);
    else s.live.push_back(std::stoll(n.substr(5)));
  }
  std::sort(s.live.begin(), s.live.end());
  return s;
}

// Whatever a crash left, pruning never removes the step `latest` names nor any newer one
// (issue 46, item 1). One process dies at each point of the save of step 6 (keep 1, 2 and
// 3), then resumes to step 9 saving every step with the same keep. After each: `latest`
// names step 9, which verifies; every step the crash left newer than `latest` is set aside
// (logged), not deleted; and exactly `keep` steps remain. Then the case as reported: a
// crash after step_6's rename, a resume to step 5 with keep 1; step_5 must stay.
TEST_F(Cli, PruningNeverRemovesWhatLatestNamesOrNewer) {
  const std::string train = cat("train ", p("nano.toml"), " --quiet --training.eval_every=0");
  int n = 0;
  for (const char* point : {"shard", "state", "index", "renamed", "latest"})
    for (int keep : {1, 2, 3}) {
      const std::string name = cat("k", n++), root = p(cat("runs/", name, "/checkpoints"));
      const std::string what = cat(point, ", keep ", keep);
      const std::string flags = cat(" --checkpoint.keep=", keep, " --job.name=", name);
      const int crashed = testing::run_command(cat(LOOM_BINARY_DIR, "/loom ", train, " --training.steps=8 --checkpoint.every=2",
                                                   flags, " --debug.fault_at=", point, ":6 2>&1")).code;
      ASSERT_EQ(crashed, 137) << what << ": the crash (SIGKILL) did not happen";
      const std::string latest_before = read_file(root + "/latest");
      const int64_t latest_step = std::stoll(latest_before.substr(5));
      const Steps before = steps_under(root);
      const Result resumed = loom(cat(train, " --resume --training.steps=9 --checkpoint.every=1", flags));
      ASSERT_EQ(resumed.code, 0) << what << "\n" << resumed.err;
      EXPECT_EQ(read_file(root + "/latest"), "step_9\n") << what;
      const Steps after = steps_under(root);
      EXPECT_EQ(after.live.size(), static_cast<size_t>(keep)) << what;
      EXPECT_EQ(after.live.back(), 9) << what;
      for (int64_t s : before.live) {
        if (s <= latest_step) continue;
        EXPECT_EQ(std::count_if(after.aside.begin(), after.aside.end(),
                                [&](const std::string& a) { return a.starts_with(cat("step_", s, ".set-aside-")); }),
                  1)
            << what << ": step_" << s << " (newer than " << latest_before << ") was not set aside";
        EXPECT_NE(resumed.err.find(cat("step_", s, " is newer than the step `latest` names")), std::string::npos)
            << what << resumed.err;
      }
      const Result verified = loom(cat("ckpt verify ", p(cat("runs/", name))));
      EXPECT_EQ(verified.code, 0) << what << ": " << verified.err;
    }
  // The reported case: latest = step_4 and step_6 on disk; a resume to step 5 with keep 1.
  const std::string root = p("runs/r/checkpoints");
  ASSERT_EQ(testing::run_command(cat(LOOM_BINARY_DIR, "/loom ", train,
                                     " --training.steps=8 --checkpoint.every=2 --checkpoint.keep=1 --debug.fault_at=renamed:6 2>&1"))
                .code,
            137);
  ASSERT_EQ(read_file(root + "/latest"), "step_4\n");
  const Result resumed = loom(cat(train, " --resume --training.steps=5 --checkpoint.every=1 --checkpoint.keep=1"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(read_file(root + "/latest"), "step_5\n");
  EXPECT_EQ(steps_under(root).live, std::vector<int64_t>{5});
  EXPECT_EQ(loom(cat("ckpt verify ", p("runs/r"))).code, 0);
  const Result again = loom(cat(train, " --resume --training.steps=6 --checkpoint.every=1 --checkpoint.keep=1"));
  EXPECT_EQ(again.code, 0) << again.err;
}

// A disk that fills up during a save (a 2 MiB tmpfs this test mounts: room for one
// checkpoint of the model, not two): every rank stops with one line naming the rank, the file
// and the cause; the half-written directory is gone and the previous checkpoint is intact,
// verifies, and resumes.
TEST_F(Cli, FullDiskDuringASaveIsNamedAndKeepsThePreviousCheckpoint) {
  const std::string mnt = p("small");
  fs::create_directories(mnt);
  if (testing::run_command(cat("mount -t tmpfs -o size=2m tmpfs ", mnt, " 2>&1")).code != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    std::string at;
    ~Unmount() { testing::run_command(cat("umount ", at)); }
  } unmount{mnt};
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), " --quiet --parallel.dp=2 --checkpoint.every=2 "
                                "--checkpoint.keep=0 --checkpoint.dir=", mnt, "/ck --job.name=full");
  const Result r = loom(cat("launch -n 2 -- ", train));
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const std::string out = r.out + r.err;
  for (const char* want : {"checkpoint step_4 failed on rank ", ".step_4.tmp/", "No space left on device"})
    EXPECT_NE(out.find(want), std::string::npos) << want << " missing from:\n" << out;
  EXPECT_EQ(read_file(mnt + "/ck/latest"), "step_2\n");
  EXPECT_FALSE(fs::exists(mnt + "/ck/.step_4.tmp"));
  const Result verified = loom(cat("ckpt verify ", mnt, "/ck"));
  EXPECT_EQ(verified.code, 0) << verified.err;
  // It resumes from step 2 (and fails again at step 4's save: the disk is still full).
  const Result resumed = loom(cat("launch -n 2 -- ", train, " --resume"));
  EXPECT_EQ(resumed.code, 1) << resumed.out << resumed.err;
  EXPECT_NE((resumed.out + resumed.err).find("at step 4: checkpoint step_4 failed"), std::string::npos)
      << resumed.out << resumed.err;
}

// A rank whose compute takes over 3x the median for 3 steps is named, not stopped
// (debug.delay_ms makes rank 1 sleep 100 ms a step); without one, nobody is named.
TEST_F(Cli, StragglersAreNamedNotStopped) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --quiet --parallel.dp=2 --training.eval_every=0 --checkpoint.every=0");
  Result r = loom(cat("launch -n 2 -- ", train, " --job.name=slow --debug.delay_ms=1:100"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string out = r.out + r.err;
  // Named once it has been over 3x for 3 steps: at step 3 at the earliest, later when the
  // median of a loaded machine's first steps is itself slow.
  EXPECT_NE(out.find(": rank 1 (replica 1) is a straggler: "), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 (replica 0) is a straggler"), std::string::npos) << out;
  // Each metrics line has every rank's compute (docs/formats.md): rank 1's holds its sleep,
  // and rank 0's waiting for the gradients is mostly waiting for it, which the report draws
  // apart from the communication.
  std::istringstream lines(read_file(p("runs/slow/metrics.jsonl")));
  int64_t steps = 0;
  for (std::string line; std::getline(lines, line); ++steps) {
    const nlohmann::json m = nlohmann::json::parse(line);
    ASSERT_EQ(m["compute_ms"].size(), 2u) << line;
    const double rank0 = m["compute_ms"][0].get<double>(), rank1 = m["compute_ms"][1].get<double>();
    EXPECT_GE(rank1, 100.0) << line;
    EXPECT_LT(rank0, rank1) << line;
    if (m["step"].get<int64_t>() > 1) {
      EXPECT_GE(m["exposed_comm_ms"].get<double>(), 0.5 * (rank1 - rank0)) << line;
    }
  }
  EXPECT_GE(steps, 3);
  r = loom(cat("report ", p("runs/slow")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(read_file(p("runs/slow/report.html")).find("waiting for the slowest rank"), std::string::npos);
  r = loom(cat("launch -n 2 -- ", train, " --job.name=even --training.steps=12"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ((r.out + r.err).find("straggler"), std::string::npos) << r.out << r.err;
}

// Elastic training (docs/launch.md, "Elastic jobs"): 4 ranks, one SIGKILLed; the launcher
// stops the rest and restarts the job from the latest checkpoint on 3 (the killed rank's
// slot retires), within 10 s of the kill; a launcher that joins with one rank makes the job
// save at its next checkpoint and go on with 4; SIGTERM to that launcher (its machine
// preempted) makes every rank save, and the job goes on with 3. The global batch stays 12 (accumulation 3,
// then 4, then 3 again), and in deterministic mode the run ends as one uninterrupted
// process does, bit for bit: no sample repeated or skipped, no step lost that is not redone.
TEST_F(Cli, ElasticJobShrinksWhenARankDiesAndGrowsWhenOneJoins) {
  write(p("secret"), "0123456789abcdef0123456789abcdef");
  std::filesystem::permissions(p("secret"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ::setenv("LOOM_SECRET_FILE", p("secret").c_str(), 1);  // the launchers' shared secret
  struct Unset {
    ~Unset() { ::unsetenv("LOOM_SECRET_FILE"); }
  } unset;  // also when an assertion ends the test early
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --parallel.deterministic=true --training.steps=200 --training.global_batch=12 "
                                "--training.micro_batch=1 --checkpoint.every=4 --training.eval_every=0");
  ASSERT_EQ(loom(cat("train ", train.substr(train.find(p("nano.toml"))), " --job.name=full")).code, 0);
  // Rank 0 sleeps 25 ms a step, so that the run lasts long enough for a launcher to join.
  const pid_t launcher = launch_in_background(
      cat("-n 2:4 --max-restarts 2 -- ", train, " --job.name=el --debug.delay_ms=0:25"), p("el.out"));
  ASSERT_GE(launcher, 0);
  const std::string metrics = p("runs/el/metrics.jsonl");
  wait_for_lines(metrics, 10);
  const pid_t victim = rank_pid(launcher, 2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  // The coordinator's first line names where to join.
  const std::string out0 = read_file(p("el.out"));
  const size_t at = out0.find("--master ");
  ASSERT_NE(at, std::string::npos) << out0;
  const std::string master = out0.substr(at + 9, out0.find(' ', at + 9) - at - 9);
  auto restarted_lines = [&] {
    const std::string m = read_file(metrics);
    int n = 0;
    for (size_t i = 0; (i = m.find("elastic_restart_s", i)) != std::string::npos; ++i) ++n;
    return n;
  };
  for (int i = 0; i < 6000 && restarted_lines() < 1; ++i) ::usleep(5000);
  ASSERT_EQ(restarted_lines(), 1) << read_file(p("el.out"));
  const pid_t joiner = launch_in_background(cat("--join --local 1 --master ", master, " -- ", train, " --job.name=el"),
                                            p("join.out"));
  // Once the job has grown back to 4, the joined launcher's machine is preempted (SIGTERM):
  // every rank saves, and the job goes on with 3 from that checkpoint.
  for (int i = 0; i < 6000 && restarted_lines() < 2; ++i) ::usleep(5000);
  ASSERT_EQ(restarted_lines(), 2) << read_file(p("el.out"));
  int status = 0;
  const Ended left = signal_and_wait(joiner, SIGTERM, joiner);
  EXPECT_TRUE(WIFEXITED(left.status) && WEXITSTATUS(left.status) == 0) << read_file(p("join.out"));
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  const std::string out = read_file(p("el.out"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;

  EXPECT_NE(out.find(cat("restart 1 of 2: rank 2 (pid ", victim, ") failed with signal 9; its slot is retired")),
            std::string::npos) << out;
  EXPECT_NE(out.find("generation 1: 3 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("launcher 1 joined with 1 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("generation 2: 4 rank(s) (resize"), std::string::npos) << out;
  // Steps lost: at most those since the last checkpoint (every 4) after a kill, none after a resize.
  EXPECT_NE(out.find("(resize: ranks joined; 3 rank(s) saved and stopped): resumed from step "), std::string::npos) << out;
  for (size_t i = 0; (i = out.find(" step(s) lost", i)) != std::string::npos; ++i) {
    const size_t semi = out.rfind("; ", i);
    const int lost = std::stoi(out.substr(semi + 2, i - semi - 2));
    EXPECT_LE(lost, 3) << out;
  }
  EXPECT_NE(out.find("on 4 rank(s); 0 step(s) lost"), std::string::npos) << out;
  EXPECT_NE(out.find("generation 3: 3 rank(s) (launcher(s) [1] left after SIGTERM)"), std::string::npos) << out;
  EXPECT_NE(out.find("on 3 rank(s); 0 step(s) lost"), std::string::npos) << out;
  // Each restart's first step within 10 s of the end of the generation before it (the
  // kill, then the resize).
  int restarts = 0;
  std::istringstream lines(read_file(metrics));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("elastic_restart_s")) continue;
    ++restarts;
    EXPECT_LT(j["elastic_restart_s"].get<double>(), 10.0) << line;
  }
  EXPECT_EQ(restarts, 3);
  EXPECT_EQ(loss_columns(read_file(p("runs/full/metrics.jsonl"))), loss_columns(read_file(metrics)));
  EXPECT_EQ(logical(p("runs/full/checkpoints/step_200"), checkpoint::Part::kModel),
            logical(p("runs/el/checkpoints/step_200"), checkpoint::Part::kModel));
  EXPECT_EQ(logical(p("runs/full/checkpoints/step_200"), checkpoint::Part::kOptimizer),
            logical(p("runs/el/checkpoints/step_200"), checkpoint::Part::kOptimizer));
}

// What an elastic job does not restart, and where it stops: a failure with no restarts
// left fails the job with the rank's code; bad input (exit 2) is never restarted; a job
// at MIN restarts a failed rank in place (its slot is not retired).
TEST_F(Cli, ElasticJobStopsWhereItMust) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --quiet --training.steps=100000 --checkpoint.every=0 --training.eval_every=0");
  Result r = loom(cat("launch -n 1:2 --max-restarts 3 -- ", train, " --job.name=bad --training.global_batch=3"));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("(bad input: not restarted)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 1"), std::string::npos) << r.err;

  // -n 2 with no restart left; -n 2 restarting in place at MIN; -n 2:3 where the layout
  // (global batch 4 in micro-batches of 2) uses 2 of the 3 ranks and rank 2 idles, until
  // rank 1's death retires a slot (3 - 1 >= MIN) and the job goes on with 2.
  struct Case {
    std::string nproc;
    int restarts;
  };
  for (const Case& k : {Case{"2", 0}, Case{"2", 1}, Case{"2:3", 1}}) {
    const std::string name = cat("n", k.nproc.substr(k.nproc.size() - 1), "r", k.restarts);
    const std::string metrics = p(cat("runs/", name, "/metrics.jsonl"));
    // Rank 0 sleeps 20 ms a step: the run outlasts the wait for its 6th step.
    const pid_t launcher = launch_in_background(cat("-n ", k.nproc, " --max-restarts ", k.restarts,
                                                    " -- ", train, " --job.name=", name,
                                                    " --training.steps=40 --checkpoint.every=5 --debug.delay_ms=0:20"),
                                                p(name + ".out"));
    wait_for_lines(metrics, 6);
    const pid_t victim = rank_pid(launcher, 1);
    ASSERT_GT(victim, 0);
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
    const std::string out = read_file(p(name + ".out"));
    if (k.restarts == 0) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGKILL) << out;
      EXPECT_NE(out.find("failed with signal 9; no restarts left (--max-restarts 0)"), std::string::npos) << out;
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    EXPECT_NE(out.find("restart 1 of 1: rank 1"), std::string::npos) << out;
    EXPECT_NE(out.find("generation 1: 2 rank(s)"), std::string::npos) << out;
    EXPECT_EQ(line_count(metrics), 40) << out;
    if (k.nproc == "2") {
      EXPECT_EQ(out.find("retired"), std::string::npos) << out;  // at MIN: restarted in place
    } else {
      EXPECT_NE(out.find("the config's layout uses 2 of the 3 ranks available"), std::string::npos) << out;
      EXPECT_NE(out.find("its slot is retired"), std::string::npos) << out;
    }
  }
}

}  // namespace
}  // namespace loom
