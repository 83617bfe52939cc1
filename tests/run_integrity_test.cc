// Nothing lost, nobody in (docs/security.md): one job per run directory, good checkpoints
// never pruned for diverged ones, paths and names that are what they claim, errors that
// stay one line whatever they echo, and JSON headers refused within bounds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "comm/auth.h"
#include "loom/core/fileio.h"
#include "loom/checkpoint/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// A loom command running in the background, its output (stdout and stderr) in a file.
class Background {
 public:
  Background(const std::string& args, const std::string& out) : out_(out) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string cmd = cat("exec ", LOOM_BINARY_DIR, "/loom ", args, " > ", out, " 2>&1");
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    done_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output() const { return read_file(out_); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  std::string out_;
};

class RunIntegrity : public Cli {
 protected:
  // The run `name` is whole: its metrics hold steps 1..steps once each and in order, its
  // latest checkpoint is step `steps` and loads, and its config.toml is its own.
  void expect_intact(const std::string& name, int steps, const std::string& config_marker) {
    const std::string run = p("runs/" + name);
    std::istringstream in(read_file(run + "/metrics.jsonl"));
    int expect = 1;
    for (std::string line; std::getline(in, line); ++expect) EXPECT_EQ(json::parse(line).at("step"), expect) << name;
    EXPECT_EQ(expect, steps + 1) << name;
    EXPECT_EQ(read_file(run + "/checkpoints/latest"), cat("step_", steps, "\n")) << name;
    EXPECT_NE(read_file(run + "/config.toml").find(config_marker), std::string::npos) << name;
    Result r = loom(cat("eval --checkpoint ", run, " --data ", p("val.bin")));
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
  }
};

// Two jobs started together under one name: exactly one runs, the other is refused at
// once naming the holder or the existing directory, and the winner's files are whole.
TEST_F(RunIntegrity, TwoJobsStartedTogetherNeverShareARunDirectory) {
  for (int i = 0; i < 12; ++i) {
    const std::string name = cat("c", i);
    const std::string args = cat("train ", p("nano.toml"), " --quiet --job.name=", name, " --training.eval_every=0");
    // The two differ only in a value config.toml shows, to tell whose files survived.
    Background a(args + " --training.warmup_steps=3", p("a.out"));
    Background b(args, p("b.out"));
    const int ca = a.wait(), cb = b.wait();
    ASSERT_TRUE((ca == 0) != (cb == 0)) << "round " << i << ": exit codes " << ca << " and " << cb << "\n"
                                        << a.output() << b.output();
    const std::string loser = ca == 0 ? b.output() : a.output();
    EXPECT_EQ(ca == 0 ? cb : ca, 2) << loser;
    EXPECT_EQ(std::count(loser.begin(), loser.end(), '\n'), 1) << loser;
    EXPECT_TRUE(loser.find("in use by another job (pid ") != std::string::npos ||
                loser.find("run directory exists") != std::string::npos)
        << loser;
    expect_intact(name, 6, ca == 0 ? "warmup_steps = 3" : "warmup_steps = 2");
  }
}

// --resume while the job runs is refused naming the holder's pid, at any moment of the
// run, and the running job finishes whole; once it is killed its lock is gone.
TEST_F(RunIntegrity, ResumeWhileRunningIsRefusedAndAKilledJobLeavesNoLock) {
  const std::string args = cat("train ", p("nano.toml"), " --quiet --job.name=long --training.eval_every=0 --training.steps=200");
  {
    Background a(args, p("a.out"));
    const std::string metrics = p("runs/long/metrics.jsonl");
    int collided = 0;
    for (size_t at : {1, 40, 80, 120, 160}) {
      wait_for_lines(metrics, at);
      Result r = loom(args + " --resume");
      if (line_count(metrics) >= 200) break;  // too late to collide
      ++collided;
      EXPECT_EQ(r.code, 2) << r.err;
      EXPECT_NE(r.err.find(cat("in use by another job (pid ", a.pid(), " on host ")), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    EXPECT_GE(collided, 2);
    ASSERT_EQ(a.wait(), 0) << a.output();
    expect_intact("long", 200, "steps = 200");
  }
  // A job killed mid-run holds nothing: --resume continues at once.
  fs::remove_all(p("runs/long"));
  Background a(args + " --checkpoint.every=5", p("a.out"));
  wait_for_lines(p("runs/long/metrics.jsonl"), 12);
  ASSERT_LT(line_count(p("runs/long/metrics.jsonl")), 200u);
  ::kill(a.pid(), SIGKILL);
  EXPECT_EQ(a.wait(), 128 + SIGKILL);
  Result r = loom(args + " --checkpoint.every=5 --resume");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_intact("long", 200, "steps = 200");
}

// A multi-rank job holds the directory across its ranks: a second launch is refused with
// exit 2 and the first finishes whole.
TEST_F(RunIntegrity, SecondLaunchOfARunningJobIsRefused) {
  const std::string args = cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                               " --quiet --job.name=two --training.eval_every=0 --training.steps=40");
  Background a(args, p("a.out"));
  wait_for_lines(p("runs/two/metrics.jsonl"), 2);
  Result r = loom(args);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("in use by another job (pid "), std::string::npos) << r.out << r.err;
  ASSERT_EQ(a.wait(), 0) << a.output();
  expect_intact("two", 40, "steps = 40");
}

// A run stopped before its first checkpoint: --resume says there is nothing to resume and
// names --restart, which keeps the old directory aside and starts afresh.
TEST_F(RunIntegrity, RestartKeepsTheOldDirectoryAside) {
  const std::string args = cat("train ", p("nano.toml"), " --quiet --job.name=early --training.eval_every=0 "
                               "--training.steps=500 --checkpoint.every=0");
  Background a(args, p("a.out"));
  wait_for_lines(p("runs/early/metrics.jsonl"), 3);
  ::kill(a.pid(), SIGKILL);
  a.wait();
  const std::string old_metrics = read_file(p("runs/early/metrics.jsonl"));
  expect_bad_input(args + " --resume", {"no checkpoint", "--restart"});
  expect_bad_input(args, {"run directory exists", "--restart"});
  expect_bad_input(args + " --resume --restart", {"--resume and --restart"});
  Result r = loom(cat("train ", p("nano.toml"), " --job.name=early --training.eval_every=0 --restart"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(p("runs")))
    if (e.path().filename().string().starts_with("early.old-")) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(read_file((aside[0] / "metrics.jsonl").string()), old_metrics);
  EXPECT_NE(r.err.find(aside[0].filename().string()), std::string::npos) << r.err;
  expect_intact("early", 6, "steps = 6");
}

TEST_F(RunIntegrity, ValuesThatMakeTrainingMeaninglessAreRefused) {
  const std::string cfg = cat("train ", p("nano.toml"), " ");
  expect_bad_input(cfg + "--training.lr=inf", {"training.lr", "expected a finite number"});
  expect_bad_input(cfg + "--training.lr=nan", {"training.lr", "expected a finite number"});
  expect_bad_input(cfg + "--training.grad_clip=-inf", {"training.grad_clip", "finite"});
  expect_bad_input(cfg + "--training.beta1=1", {"training.beta1", "expected in [0, 1)"});
  expect_bad_input(cfg + "--training.beta2=-0.5", {"training.beta2", "expected in [0, 1)"});
  expect_bad_input(cfg + "--training.momentum=1.5", {"training.momentum", "expected in [0, 1)"});
  expect_bad_input(cfg + "--training.weight_decay=-0.1", {"training.weight_decay", "expected >= 0"});
  expect_bad_input(cfg + "--training.eps=0", {"training.eps", "expected > 0"});
  expect_bad_input(cfg + "--training.min_lr=1", {"training.min_lr", "expected <= training.lr"});
  EXPECT_FALSE(fs::exists(p("runs")));
}

// A run that diverges (far too large a learning rate) stops at the first step whose loss or
// gradient norm is not finite, naming the step and the first non-finite gradient, before
// updating; the checkpoints it wrote are finite and intact, and checkpoint.keep never prunes
// the last of them. A checkpoint every step: step 1's gradients (from the initial weights)
// are always finite, so whichever later step diverges, one is written.
TEST_F(RunIntegrity, DivergedRunStopsAndKeepsItsLastFiniteCheckpoint) {
  Result r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=d --training.lr=1000 --training.min_lr=0 "
                      "--training.grad_clip=0 --training.warmup_steps=0 --training.steps=40 --checkpoint.every=1 "
                      "--checkpoint.keep=1 --training.eval_every=0"));
  ASSERT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const char* part : {"loom: error: rank 0 at step ", "not finite", "the first non-finite gradient is transformer.",
                           "The run stops before updating", "is intact"})
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " in " << r.err;
  EXPECT_EQ(r.err.find("the loss is not finite"), std::string::npos) << r.err;
  // checkpoint.keep = 1 keeps the last step saved, which the error names; when its weights
  // had already gone non-finite (a loss can stay finite a step longer), also the newest
  // finite one, which is what training can resume from.
  std::map<int64_t, bool> kept;  // step -> its state.json's "finite"
  for (const auto& e : fs::directory_iterator(p("runs/d/checkpoints")))
    if (e.is_directory()) {
      const json state = json::parse(read_file(e.path().string() + "/state.json"));
      kept[state.at("step").get<int64_t>()] = state.at("finite").get<bool>();
    }
  ASSERT_FALSE(kept.empty());
  ASSERT_LE(kept.size(), 2u);
  const auto last = std::prev(kept.end());
  EXPECT_NE(r.err.find(cat("step_", last->first, ", is intact")), std::string::npos) << r.err;
  EXPECT_EQ(kept.size() == 2, !last->second) << "kept " << kept.size() << " checkpoint(s)";
  EXPECT_TRUE(kept.begin()->second) << "the newest finite checkpoint was pruned";
  // The metrics stop at the step before: no line for the step that stopped.
  const std::string metrics = read_file(p("runs/d/metrics.jsonl"));
  const int64_t stopped = std::stoll(r.err.substr(r.err.find(" at step ") + 9));
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), stopped - 1);
  r = loom(cat("eval --checkpoint ", p(cat("runs/d/checkpoints/step_", kept.begin()->first)), " --data ", p("val.bin")));
  EXPECT_EQ(r.code, 0) << r.err;
}

// Deterministic mode sums gradients exactly, which holds only finite values below 2^31:
// a diverging run stops the same way, naming the first gradient it could not sum.
TEST_F(RunIntegrity, DivergedDeterministicRunStopsNamingTheGradient) {
  Result r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=dd --training.lr=1000 --training.min_lr=0 "
                      "--training.grad_clip=0 --training.warmup_steps=0 --training.steps=40 --checkpoint.every=0 "
                      "--training.eval_every=0 --parallel.deterministic=true"));
  ASSERT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const char* part : {"loom: error: rank 0 at step ", "gradient norm (nan) is not finite",
                           "the first gradient deterministic mode cannot sum exactly (not finite, or 2^31 or more in "
                           "magnitude) is transformer.", "The run stops before updating"})
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " in " << r.err;
}

// Config, data and checkpoint paths must be what their format expects; names with control
// characters are refused; whatever an error echoes, it stays one line.
TEST_F(RunIntegrity, PathsAndNamesAreWhatTheyClaim) {
  const std::string cfg = cat("train ", p("nano.toml"), " ");
  fs::create_directories(p("adir"));
  ASSERT_EQ(::mkfifo(p("fifo").c_str(), 0600), 0);
  expect_bad_input(cat("train ", p("adir")), {"adir", "not a regular file"});
  expect_bad_input(cat("train ", p("fifo")), {"fifo", "not a regular file"});
  expect_bad_input(cat("eval --checkpoint ", p("fifo"), " --data ", p("val.bin")), {"fifo", "not a regular file"});
  expect_bad_input(cat("eval --checkpoint ", p("adir"), " --data ", p("val.bin")), {"adir", "not a checkpoint"});
  expect_bad_input(cfg + "--data.train=" + p("adir"), {"adir", "not a regular file"});
  expect_bad_input(cfg + "--data.train=" + p("fifo"), {"fifo", "not a regular file"});
  expect_bad_input(cfg + "--job.name=\"$(printf 'a\\nb')\"", {"job.name", "a\\nb", "control character"});
  expect_bad_input(cfg + "--job.name=\"$(printf 'x\\033[2Jy')\"", {"job.name", "x\\x1b[2Jy", "control character"});
  // TOML holds UTF-8 only: a flag's value that is not UTF-8 would not read back from the run's config.toml.
  expect_bad_input(cfg + "--job.name=\"$(printf 'a\\377b')\"", {"job.name", "a\\xffb", "not UTF-8"});
  write(p("nul.toml"), "[job]\nname = \"a\\u0000b\"\n");
  expect_bad_input(cat("train ", p("nul.toml")), {"job.name", "a\\x00b", "control character"});
  write(p("runs_file"), "");
  expect_bad_input(cfg + "--job.run_dir=" + p("runs_file"), {"runs_file"});
  fs::create_directories(p("runs"));
  write(p("runs/plain"), "");
  expect_bad_input(cfg + "--job.name=plain", {"plain", "not a directory"});
  // A tensor name carrying a newline and a terminal escape: the error names it on one line.
  const std::string header = "{\"evil\\n\\u001b[2Jname\": {\"dtype\": \"Q9\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  write(p("evil.safetensors"), file + header + std::string(4, '\0'));
  expect_bad_input(cat("eval --checkpoint ", p("evil.safetensors"), " --data ", p("val.bin")),
                   {"evil\\n\\x1b[2Jname", "unsupported dtype Q9"});
}

// Headers and index files are refused within bounds: an oversized safetensors header and
// deeply nested JSON in a header, an index.json and a state.json, each in well under a
// second where the unbounded parser took 27 s and 3.7 GB.
TEST_F(RunIntegrity, JsonIsParsedWithinBounds) {
  auto safetensors_with_header = [&](const std::string& name, const std::string& header) {
    std::string file(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(file.data(), &n, 8);
    write(p(name), file + header);
  };
  auto timed_bad_input = [&](const std::string& args, std::initializer_list<std::string> fragments) {
    const auto t0 = std::chrono::steady_clock::now();
    expect_bad_input(args, fragments);
    // Generous for a loaded machine; the unbounded parser took minutes at these sizes.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0) << args;
  };
  const std::string data = " --data " + p("val.bin");
  safetensors_with_header("deep.safetensors", std::string(8 << 20, '[') + std::string(8 << 20, ']'));
  timed_bad_input("eval --checkpoint " + p("deep.safetensors") + data, {"deep.safetensors", "nested deeper than 3"});
  safetensors_with_header("big.safetensors", "{\"a\": \"" + std::string(20 << 20, 'x') + "\"}");
  timed_bad_input("eval --checkpoint " + p("big.safetensors") + data, {"big.safetensors", "over the 16777216-byte limit"});

  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  const std::string step = p("runs/r/checkpoints/step_3");
  const std::string deep = std::string(1 << 20, '[') + std::string(1 << 20, ']');
  fs::copy(step, p("deep_index"));
  write(p("deep_index/index.json"), deep);
  fs::remove(p("deep_index/index.sha256"));  // else its hash refuses it before parsing
  timed_bad_input("eval --checkpoint " + p("deep_index") + data, {"index.json", "nested deeper than 8"});
  // state.json: its hash in index.json updated to match, and the index's own hash, as a
  // careless tool would leave them.
  fs::copy(step, p("deep_state"));
  write(p("deep_state/state.json"), deep);
  json index = json::parse(read_file(p("deep_state/index.json")));
  index["files"]["state.json"] = {{"bytes", deep.size()}, {"sha256", sha256_hex(deep)}};
  write(p("deep_state/index.json"), index.dump());
  write(p("deep_state/index.sha256"), sha256_hex(index.dump()) + "\n");
  timed_bad_input("eval --checkpoint " + p("deep_state") + data, {"state.json", "nested deeper than 8"});
}

// The ports `pid` listens on (TCP, IPv4), from /proc.
std::vector<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cat("/proc/", pid, "/fd"), ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<int> ports;
  std::istringstream in(slurp_proc("/proc/net/tcp"));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode)) ports.push_back(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return ports;
}

// Someone without the secret who knows the job id: from `source` (a loopback address),
// connects to every port the job listens on and offers a handshake with a wrong secret
// claiming rank 1 of the job, `pause` apart, until stopped.
class Attacker {
 public:
  Attacker(std::string source, std::string job_id, std::chrono::milliseconds pause)
      : source_(std::move(source)), job_id_(std::move(job_id)), pause_(pause), thread_([this] { run(); }) {}
  ~Attacker() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void aim(pid_t launcher, int store_port) {
    launcher_ = launcher;
    store_port_ = store_port;
  }
  int64_t refused() const { return refused_; }  // handshakes answered "wrong secret"

 private:
  void run() {
    std::vector<int> ports;
    auto looked = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    while (!stop_) {
      if (std::chrono::steady_clock::now() - looked > std::chrono::milliseconds(50)) {  // the ranks' listeners come and go
        looked = std::chrono::steady_clock::now();
        ports.clear();
        if (store_port_ > 0) ports.push_back(store_port_);
        if (launcher_ > 0)
          for (pid_t child : children_of(launcher_))
            for (int port : listening_ports(child)) ports.push_back(port);
      }
      for (int port : ports) attack(port);
      if (ports.empty() || pause_.count() > 0) std::this_thread::sleep_for(std::max(pause_, std::chrono::milliseconds(1)));
    }
  }
  void attack(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, source_.c_str(), &a.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      try {
        comm::auth::connect_handshake(fd, "not the secret", {.job_id = job_id_, .purpose = "store", .rank = 1, .size = 2},
                                      comm::Clock::now() + std::chrono::milliseconds(300), "job");
        ADD_FAILURE() << "a wrong secret was accepted on port " << port;
      } catch (const Error& e) {
        if (std::string(e.what()).find("wrong secret") != std::string::npos) ++refused_;
      }
    }
    ::close(fd);
  }

  std::string source_, job_id_;
  std::chrono::milliseconds pause_;
  std::atomic<bool> stop_{false};
  std::atomic<pid_t> launcher_{-1};
  std::atomic<int> store_port_{-1};
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

// The attack of the issue, replayed: handshakes with a wrong MAC but the job's real id, from
// before the store listens until the launcher has exited (rendezvous, training, shutdown),
// paced from the ranks' own address and as a flood from another. The job never hears of
// them: its losses are bitwise those of an undisturbed run, and the store logs the refusals.
TEST_F(RunIntegrity, HandshakesWithoutTheSecretNeverActOnTheJob) {
  const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                                " --quiet --training.eval_every=0 --training.steps=60 --comm.transport=tcp");
  const int port = free_port();
  const std::string launch = cat("launch -n 2 --master 127.0.0.1:", port, " -- ", train);
  Result calm = loom(launch + " --job.name=calm");
  ASSERT_EQ(calm.code, 0) << calm.err;
  for (int round = 0; round < 2; ++round) {
    const std::string job_id = cat("known-job-", round);
    Attacker paced("127.0.0.1", job_id, std::chrono::milliseconds(20));
    Attacker flood("127.0.0.2", job_id, std::chrono::milliseconds(0));
    const std::string name = cat("attacked", round);
    ::setenv("LOOM_JOB_ID", job_id.c_str(), 1);  // the launcher takes it as the job id: the attacker knows it
    Background job(launch + " --job.name=" + name, p("attacked.out"));
    ::unsetenv("LOOM_JOB_ID");
    paced.aim(job.pid(), port);
    flood.aim(job.pid(), port);
    const int code = job.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // past the shutdown
    paced.stop();
    flood.stop();
    const std::string out = job.output();
    ASSERT_EQ(code, 0) << out;
    std::printf("round %d: %lld paced and %lld flooded handshakes refused\n", round,
                static_cast<long long>(paced.refused()), static_cast<long long>(flood.refused()));
    EXPECT_GT(paced.refused(), 5) << out;
    EXPECT_GT(flood.refused(), 5) << out;
    EXPECT_NE(out.find("store: refused 127.0.0.2:"), std::string::npos) << out;
    EXPECT_EQ(loss_columns(read_file(p("runs/calm/metrics.jsonl"))), loss_columns(read_file(p("runs/" + name + "/metrics.jsonl"))));
  }
}

// Every regular file under `root` (at most 1 MiB each) that contains `needle`.
std::vector<std::string> files_containing(const std::string& root, const std::string& needle) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec) || it->file_size(ec) > (1u << 20)) continue;
    if (slurp_proc(it->path().string()).find(needle) != std::string::npos) out.push_back(it->path().string());
  }
  return out;
}

// The launcher's secret is in no command line, log or run directory, and no file in the
// temporary directory holds it, during the job or after a SIGKILLed launcher.
TEST_F(RunIntegrity, LaunchSecretIsNeverOnDisk) {
  Background job(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                     " --quiet --job.name=s --training.eval_every=0 --training.steps=100000 --checkpoint.every=5"),
                 p("job.out"));
  wait_for_lines(p("runs/s/metrics.jsonl"), 10);
  std::vector<pid_t> ranks = children_of(job.pid());
  ASSERT_EQ(ranks.size(), 2u);
  // The rank's own view of it: LOOM_SECRET_FILE in its environment names a descriptor.
  const std::string env = slurp_proc(cat("/proc/", ranks[0], "/environ"));
  const size_t at = env.find("LOOM_SECRET_FILE=/proc/self/fd/");
  ASSERT_NE(at, std::string::npos);
  const std::string fd = env.substr(at + 31, env.find('\0', at) - at - 31);
  const std::string secret = slurp_proc(cat("/proc/", ranks[0], "/fd/", fd));
  ASSERT_EQ(secret.size(), 64u);
  for (pid_t pid : {job.pid(), ranks[0], ranks[1]})
    EXPECT_EQ(slurp_proc(cat("/proc/", pid, "/cmdline")).find(secret), std::string::npos);
  const std::string tmp = fs::temp_directory_path().string();
  EXPECT_EQ(files_containing(tmp, secret), std::vector<std::string>{});
  ::kill(job.pid(), SIGKILL);
  job.wait();
  for (pid_t pid : ranks) {  // the kernel tells the ranks their launcher is gone (PR_SET_PDEATHSIG)
    auto alive = [&] {  // a zombie waiting for a reaper has ended
      const std::string stat = slurp_proc(cat("/proc/", pid, "/stat"));
      return !stat.empty() && stat.find(") Z ") == std::string::npos;
    };
    for (int i = 0; i < 1000 && alive(); ++i) ::usleep(10000);
    EXPECT_FALSE(alive()) << "rank pid " << pid << " outlived its launcher";
    ::kill(pid, SIGKILL);
  }
  EXPECT_EQ(files_containing(tmp, secret), std::vector<std::string>{});
  EXPECT_EQ(job.output().find(secret), std::string::npos);
}

}  // namespace
}  // namespace loom
