// Parameter servers from the command line (docs/parallelism.md, "Parameter servers"): real
// processes under loom launch. Sync training is bitwise equal to one process (losses,
// weights, optimizer state) and resumes bitwise after a server dies; async training goes
// on without a worker that is killed; impossible layouts are one-line errors.
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.h"

namespace loom {
namespace {

// The metrics lines of training steps (not the final evaluation's), to the grad norm.
std::vector<std::string> step_columns(const std::string& metrics) {
  std::vector<std::string> out;
  for (const std::string& line : loss_columns(metrics))
    if (line.find("\"loss\"") != std::string::npos) out.push_back(line);
  return out;
}

TEST_F(Cli, ParamServerSyncIsBitwiseEqualToOneProcessAndResumesAfterAServerDies) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --quiet --parallel.deterministic=true --training.micro_batch=1");
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --parallel.deterministic=true --training.micro_batch=1 "
                     "--job.name=one")).code, 0);
  const std::string ps = cat(train, " --parallel.ps_servers=2");
  Result r = loom(cat("launch -n 4 -- ", ps, " --job.name=ps --profile.trace_steps=2"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // The trace: every rank, the workers' pushes and pulls on the communication track.
  const std::string trace = read_file(p("runs/ps/trace.json"));
  for (const char* what : {"\"push gradients\"", "\"pull parameters\"", "\"micro-step 0\"", "\"rank 3\"", "\"step 2 (2 pushes)\""})
    EXPECT_NE(trace.find(what), std::string::npos) << what;
  EXPECT_NE(r.out.find("parameter servers: 2 server(s), 2 worker(s), sync"), std::string::npos) << r.out;
  const std::vector<std::string> want = step_columns(read_file(p("runs/one/metrics.jsonl")));
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(step_columns(read_file(p("runs/ps/metrics.jsonl"))), want);
  for (auto part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
    EXPECT_EQ(logical(p("runs/ps/checkpoints/step_6"), part), logical(p("runs/one/checkpoints/step_6"), part));

  // A host's workers summing first (forced on one host; and "auto" with the servers on
  // another host, simulated by LOOM_HOST_ID): the same bits, and the host all-reduce seen.
  write(p("two_hosts.sh"), "#!/bin/sh\nif [ \"$RANK\" -lt 2 ]; then export LOOM_HOST_ID=a; else export LOOM_HOST_ID=b; fi\n"
                           "exec \"$@\"\n");
  std::filesystem::permissions(p("two_hosts.sh"), std::filesystem::perms::owner_all);
  for (const std::string& how : {std::string("launch -n 4 -- ") + ps + " --parallel.ps_hierarchical=on",
                                 cat("launch -n 5 -- ", p("two_hosts.sh"), " ", ps, " --training.global_batch=6")}) {
    const bool five = how.find("-n 5") != std::string::npos;
    const std::string name = five ? "two_hosts" : "on";
    if (five) {  // the reference for a global batch of 6
      ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --parallel.deterministic=true --training.micro_batch=1 "
                         "--training.global_batch=6 --job.name=one6")).code, 0);
    }
    r = loom(cat(how, " --job.name=", name));
    ASSERT_EQ(r.code, 0) << how << "\n" << r.out << r.err;
    const std::string m = read_file(p(cat("runs/", name, "/metrics.jsonl")));
    EXPECT_EQ(step_columns(m), step_columns(read_file(p(five ? "runs/one6/metrics.jsonl" : "runs/one/metrics.jsonl")))) << how;
    EXPECT_EQ(m.find("\"ps_local_bytes\": 0,"), std::string::npos) << how << ": no host all-reduce\n" << m;
  }
  EXPECT_NE(read_file(p("runs/ps/metrics.jsonl")).find("\"ps_local_bytes\": 0,"), std::string::npos)
      << "one host, auto: the workers push alone";

  // Server 0 dies right after committing step 3; --resume takes the job from there.
  r = loom(cat("launch -n 4 -- ", ps, " --job.name=cut --debug.fault_at=latest:3:0"));
  EXPECT_NE(r.code, 0) << "the crash did not happen\n" << r.out << r.err;
  EXPECT_EQ(read_file(p("runs/cut/checkpoints/latest")), "step_3\n");
  r = loom(cat("launch -n 4 -- ", ps, " --job.name=cut --resume"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(step_columns(read_file(p("runs/cut/metrics.jsonl"))), want);
  for (auto part : {checkpoint::Part::kModel, checkpoint::Part::kOptimizer})
    EXPECT_EQ(logical(p("runs/cut/checkpoints/step_6"), part), logical(p("runs/one/checkpoints/step_6"), part));
}

TEST_F(Cli, ParamServerAsyncGoesOnWithoutAKilledWorker) {
  const std::string metrics = p("runs/async/metrics.jsonl");
  const pid_t launcher = launch_in_background(
      cat("-n 4 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
          " --quiet --parallel.ps_servers=1 --parallel.ps_mode=async --training.steps=400 --training.global_batch=6 "
          "--training.micro_batch=1 --training.eval_every=0 --checkpoint.every=0 --job.name=async"),
      p("async.out"));
  ASSERT_GE(launcher, 0);
  wait_for_lines(metrics, 20);
  const pid_t victim = rank_pid(launcher, 2);
  ASSERT_GT(victim, 0);
  const Ended ended = signal_and_wait(victim, SIGKILL, launcher);
  const std::string out = read_file(p("async.out"));
  EXPECT_EQ(WEXITSTATUS(ended.status), 0) << out;
  EXPECT_NE(out.find(cat("rank 2 (pid ", victim, ") failed with signal 9; it declared itself expendable")), std::string::npos)
      << out;
  EXPECT_NE(out.find("parameter server 0: dropped worker rank 2: rank 2 died"), std::string::npos) << out;
  const std::string lines = read_file(metrics);
  EXPECT_NE(lines.find("{\"step\": 400, \"loss\""), std::string::npos) << "the run did not reach its last step";
  EXPECT_NE(lines.find("\"final_val_loss\""), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(p("runs/async/checkpoints/step_400")));
}

// A worker killed mid-run, then one started later with the job's store, secret and id:
// the servers link to it, it pulls the parameters and pushes until the run ends.
TEST_F(Cli, ParamServerSspServesAWorkerThatJoins) {
  write(p("secret"), "0123456789abcdef0123456789abcdef");
  std::filesystem::permissions(p("secret"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const int port = free_port();
  // The launcher takes the job's secret and id from here (its ranks, and the joiner, too).
  ::setenv("LOOM_SECRET_FILE", p("secret").c_str(), 1);
  ::setenv("LOOM_JOB_ID", "ps-join-test", 1);
  const std::string cfg = cat(p("nano.toml"), " --parallel.ps_servers=1 --parallel.ps_mode=ssp --parallel.ps_staleness=2 "
                              "--training.steps=300 --training.micro_batch=1 --training.eval_every=0 --checkpoint.every=0 "
                              "--job.name=join");
  const pid_t launcher = launch_in_background(
      // Worker 0 takes 5 ms more a step: the run outlasts the joiner's start.
      cat("-n 3 --master 127.0.0.1:", port, " -- ", LOOM_BINARY_DIR, "/loom train ", cfg, " --quiet --debug.delay_ms=1:5"),
      p("join.out"));
  ASSERT_GE(launcher, 0);
  const std::string metrics = p("runs/join/metrics.jsonl");
  wait_for_lines(metrics, 20);
  const pid_t victim = rank_pid(launcher, 2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  wait_for_lines(metrics, 40);
  const Result joiner = loom(cat("train ", cfg, " --ps-join 127.0.0.1:", port));
  ::unsetenv("LOOM_SECRET_FILE");
  ::unsetenv("LOOM_JOB_ID");
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  const std::string out = read_file(p("join.out"));
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(joiner.code, 0) << joiner.out << joiner.err;
  EXPECT_NE(joiner.err.find("joined the parameter-server job at 127.0.0.1:"), std::string::npos) << joiner.err;
  EXPECT_NE(joiner.err.find("as worker rank 3"), std::string::npos) << joiner.err;
  const std::string lines = read_file(metrics);
  EXPECT_NE(lines.find("\"ps_staleness\": \"-1,"), std::string::npos) << "after the kill, link 1 pushes no more";
  const size_t last = lines.find("{\"step\": 300, \"loss\"");
  ASSERT_NE(last, std::string::npos) << "the run did not reach its last step";
  // Per step, the staleness of each link's push ("-1": none). Which live workers push in
  // one particular step depends on timing (ssp lets them run up to K apart), so: the dead
  // link pushes nothing in the last step, and after the kill both worker 0 (link 0) and
  // the joined worker (link 2) push in some steps.
  auto links = [](const std::string& line) {
    const std::string key = "\"ps_staleness\": \"";
    const size_t at = line.find(key) + key.size();
    std::vector<std::string> out;
    std::stringstream in(line.substr(at, line.find('"', at) - at));
    for (std::string f; std::getline(in, f, ',');) out.push_back(f);
    return out;
  };
  const std::vector<std::string> final_links = links(lines.substr(last, lines.find('\n', last) - last));
  ASSERT_EQ(final_links.size(), 3u) << lines.substr(last, 400);
  EXPECT_EQ(final_links[1], "-1") << "the dead worker pushed in the last step";
  bool zero_after_kill = false, joined = false;
  std::stringstream all(lines);
  for (std::string line; std::getline(all, line);) {
    const std::vector<std::string> l = links(line);
    if (l.size() != 3 || l[1] != "-1") continue;
    zero_after_kill |= l[0] != "-1";
    joined |= l[2] != "-1";
  }
  EXPECT_TRUE(zero_after_kill) << "worker 0 pushed nothing after the kill";
  EXPECT_TRUE(joined) << "the joined worker pushed nothing";
}

TEST_F(Cli, ParamServerLayoutsThatCannotWorkAreRefused) {
  const std::string train = cat("train ", p("nano.toml"), " --dry-run");
  expect_bad_input(cat("train ", p("nano.toml"), " --parallel.ps_servers=1"),
                   {"parallel.ps_servers (from --parallel.ps_servers=1) = 1, but the job has 1 rank(s)", "fewer servers"});
  expect_bad_input(cat(train, " --parallel.dp=2 --parallel.ps_servers=1 --parallel.ps_mode=eventual"),
                   {"parallel.ps_mode", "\"eventual\"", "sync, async, ssp"});
  expect_bad_input(cat(train, " --parallel.dp=2 --parallel.ps_servers=1 --parallel.ps_staleness=2"),
                   {"parallel.ps_staleness", "ssp"});
  expect_bad_input(cat(train, " --parallel.dp=2 --parallel.ps_servers=1 --parallel.ps_mode=async --parallel.deterministic=true"),
                   {"parallel.deterministic", "\"async\"", "sync"});
  expect_bad_input(cat(train, " --parallel.dp=2 --parallel.ps_servers=1 --parallel.zero=1"), {"parallel.zero = 1", "zero = 0"});
  expect_bad_input(cat(train, " --parallel.dp=1 --parallel.tp=2 --parallel.ps_servers=1"), {"tp = pp = 1"});
}

}  // namespace
}  // namespace loom
