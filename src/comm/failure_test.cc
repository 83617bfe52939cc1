// Never a silent hang: real processes, real signals. Each test starts comm_worker ranks
// with a torchrun-style environment against a store this test serves, injects a fault,
// and expects every survivor to exit with a typed error naming the culprit in time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/auth.h"
#include "comm/handshake_budget.h"
#include "comm/net.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {
namespace {

const std::string kWorker = LOOM_BINARY_DIR "/src/comm/comm_worker";

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Rank {
  pid_t pid = -1;
  std::string out_path;
  int code = -1;
  std::string output() const {
    std::ifstream f(out_path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

class Job {
 public:
  explicit Job(std::string secret = "s3cret", std::string job = "test-job")
      : secret_(std::move(secret)), job_(std::move(job)),
        server_({.secret = secret_, .job_id = job_}) {}
  ~Job() {
    for (auto& r : ranks_)
      if (r.code < 0) {
        ::kill(r.pid, SIGKILL);
        ::kill(r.pid, SIGCONT);
        ::waitpid(r.pid, nullptr, 0);
      }
    for (auto& r : ranks_) std::remove(r.out_path.c_str());
  }

  // Starts a rank with a 1 s collective timeout (args may set another: a later option
  // wins); `env` adds or overrides variables.
  void start(int rank, int world, std::vector<std::string> args,
             std::vector<std::pair<std::string, std::string>> env = {}) {
    Rank r;
    r.out_path = cat("/tmp/loom_failure_", ::getpid(), "_", ranks_.size(), ".out");
    r.pid = ::fork();
    if (r.pid == 0) {
      int fd = ::open(r.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(server_.port()).c_str(), 1);
      ::setenv("LOOM_STORE_HOSTED", "1", 1);
      ::setenv("LOOM_SECRET", secret_.c_str(), 1);
      ::setenv("LOOM_JOB_ID", job_.c_str(), 1);
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::string timeout_flag = "--timeout-ms", timeout = "1000";
      std::vector<char*> argv{const_cast<char*>(kWorker.c_str()), timeout_flag.data(), timeout.data()};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ranks_.push_back(r);
  }

  void wait_ready() {
    for (auto& r : ranks_)
      for (int i = 0; i < 1000 && r.output().find("READY") == std::string::npos; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // Waits for every rank but `skip` to exit (10 s at most: a hang fails the test).
  void wait_exit(int skip = -1) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (static_cast<int>(i) == skip) continue;
      Rank& r = ranks_[i];
      int status = 0;
      while (::waitpid(r.pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > until) {
          ADD_FAILURE() << "rank " << i << " hung; output: " << r.output();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }

  Rank& operator[](size_t i) { return ranks_[i]; }
  std::string secret_, job_;
  TcpStoreServer server_;

 private:
  std::vector<Rank> ranks_;
};

// "ERROR <kind> <unix_ms> <message>" -> fields.
struct ErrorLine {
  std::string kind, message;
  int64_t ms = 0;
};
ErrorLine error_of(const std::string& out) {
  ErrorLine e;
  auto pos = out.find("ERROR ");
  if (pos == std::string::npos) return e;
  std::istringstream in(out.substr(pos + 6));
  in >> e.kind >> e.ms;
  std::getline(in >> std::ws, e.message);
  return e;
}

class Failure : public ::testing::TestWithParam<const char*> {};

// Three ranks run `op` on 256 KiB in a loop over `transport`, well into it on return.
void start_looping_ranks(Job& job, const char* transport, const char* op = "all_reduce") {
  for (int r = 0; r < 3; ++r) job.start(r, 3, {"--transport", transport, "loop", "262144", op});
  job.wait_ready();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// Both ops, since all_gather's rounds wait on different counters than all_reduce's.
TEST_P(Failure, KilledRankIsNamedWithinOneSecond) {
  for (const char* op : {"all_reduce", "all_gather"}) {
    Job job;
    start_looping_ranks(job, GetParam(), op);
    int64_t killed = now_ms();
    ::kill(job[1].pid, SIGKILL);
    job.wait_exit();
    for (int r : {0, 2}) {
      ErrorLine e = error_of(job[r].output());
      EXPECT_EQ(job[r].code, 3) << op << ": " << job[r].output();
      EXPECT_EQ(e.kind, "PeerLostError") << op << ": " << job[r].output();
      EXPECT_NE(e.message.find("rank 1 died"), std::string::npos) << op << ": " << e.message;
      EXPECT_LT(e.ms - killed, 1000) << op << ": " << e.message;
    }
  }
}

TEST_P(Failure, StoppedRankIsNamedAfterTheTimeout) {
  Job job;
  start_looping_ranks(job, GetParam());
  int64_t stopped = now_ms();
  ::kill(job[2].pid, SIGSTOP);
  job.wait_exit(2);
  for (int r : {0, 1}) {
    ErrorLine e = error_of(job[r].output());
    EXPECT_EQ(e.kind, "TimeoutError") << job[r].output();
    EXPECT_NE(e.message.find("rank 2"), std::string::npos) << e.message;
    EXPECT_LT(e.ms - stopped, 1000 + 1000) << e.message;  // timeout (1 s) + 1 s
  }
}

TEST_P(Failure, MismatchedCollectivesNameBothCalls) {
  for (const char* mode : {"mismatch", "skip"}) {
    Job job;
    int64_t start = now_ms();
    for (int r = 0; r < 3; ++r) job.start(r, 3, {"--transport", GetParam(), mode});
    job.wait_exit();
    for (int r = 0; r < 3; ++r) {
      ErrorLine e = error_of(job[r].output());
      EXPECT_EQ(e.kind, "MismatchError") << mode << " rank " << r << ": " << job[r].output();
      std::string a = mode == std::string("mismatch") ? "all_reduce" : "barrier";
      std::string b = mode == std::string("mismatch") ? "broadcast" : "all_reduce";
      EXPECT_NE(e.message.find(a), std::string::npos) << e.message;
      EXPECT_NE(e.message.find(b), std::string::npos) << e.message;
      EXPECT_LT(e.ms - start, 2000) << e.message;  // start-up included; detection is immediate
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Failure, ::testing::Values("shm", "tcp"));

// A rank with the wrong secret is refused and told why, at once; the job is not told
// anything (docs/security.md): its ranks wait for the rank that holds the secret, and when
// it comes the job runs. The wrong rank's claim leaves no trace in the store.
TEST(Rendezvous, WrongSecretIsRefusedAndNeverActsOnTheJob) {
  Job job;
  int64_t start = now_ms();
  job.start(0, 2, {"--timeout-ms", "8000", "mismatch"});
  job.start(1, 2, {"mismatch"}, {{"LOOM_SECRET", "guess"}});
  job.wait_exit(0);
  ErrorLine bad = error_of(job[1].output());
  EXPECT_EQ(bad.kind, "AuthError") << job[1].output();
  EXPECT_NE(bad.message.find("wrong secret"), std::string::npos) << bad.message;
  EXPECT_LT(bad.ms - start, 2000);
  TcpStore probe({.port = job.server_.port(), .secret = job.secret_, .job_id = job.job_}, Clock::now() + std::chrono::seconds(2));
  EXPECT_FALSE(probe.try_get("world/peer/1", Clock::now() + std::chrono::seconds(2)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(job[0].output().find("ERROR"), std::string::npos) << "rank 0 heard of the refused handshake: " << job[0].output();
  // The real rank 1: the two meet and run the scripted mismatch to its own error.
  job.start(1, 2, {"mismatch"});
  job.wait_exit(1);
  for (int r : {0, 2}) EXPECT_EQ(error_of(job[r].output()).kind, "MismatchError") << job[r].output();
}

// Per source address: at most max_in_flight at once, a burst, then the refill rate; other
// addresses keep their own budget; refusals are logged one by one, then paced.
TEST(Rendezvous, HandshakeBudgetIsPerAddress) {
  HandshakeBudget b({.max_in_flight = 2, .burst = 3, .per_second = 10});
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(b.admit("a", t0));
  EXPECT_TRUE(b.admit("a", t0));
  EXPECT_FALSE(b.admit("a", t0)) << "two in flight";
  EXPECT_TRUE(b.admit("b", t0)) << "another address has its own budget";
  b.finish("a");
  EXPECT_TRUE(b.admit("a", t0));
  b.finish("a");
  b.finish("a");
  EXPECT_FALSE(b.admit("a", t0)) << "the burst of 3 is spent";
  EXPECT_FALSE(b.admit("a", t0 + std::chrono::milliseconds(50)));
  EXPECT_TRUE(b.admit("a", t0 + std::chrono::milliseconds(110))) << "one token back after 0.1 s";
  int64_t logged = 0, lines = 0;
  for (int i = 0; i < 100; ++i)
    if (const int64_t n = b.to_log("c", t0 + std::chrono::milliseconds(i)); n > 0) logged += n, ++lines;
  EXPECT_EQ(lines, 5);
  EXPECT_EQ(logged, 5) << "one refusal per line";
  EXPECT_EQ(b.to_log("c", t0 + std::chrono::seconds(11)), 96) << "the rest in one line, 10 s later";
}

// The tcp transport's listener: connections queued ahead of rank 1 (handshakes with a
// wrong secret but the job's id, bytes that are no handshake, one that says nothing) are
// logged and dropped, the silent one after a few seconds rather than the job's deadline;
// then rank 1's handshake is accepted and the job runs.
TEST(Rendezvous, TcpListenerDropsWhoeverLacksTheSecret) {
  Job job;
  job.start(0, 2, {"--transport", "tcp", "--timeout-ms", "20000", "mismatch"});
  TcpStore probe({.port = job.server_.port(), .secret = job.secret_, .job_id = job.job_}, Clock::now() + std::chrono::seconds(2));
  std::istringstream info(probe.get("world/peer/0", Clock::now() + std::chrono::seconds(5)));
  std::string host;
  int port = 0;
  info >> host >> port;
  std::atomic<int> refused{0};
  std::vector<std::thread> attackers;
  for (int i = 0; i < 10; ++i)
    attackers.emplace_back([&] {
      const Deadline d = Clock::now() + std::chrono::seconds(15);
      net::Fd fd = net::connect_tcp(host, port, d, "rank 0");
      try {
        auth::connect_handshake(fd.get(), "guess", {.job_id = job.job_, .purpose = "world", .rank = 1, .size = 2}, d, "rank 0");
      } catch (const AuthError& e) {
        if (std::string(e.what()).find("wrong secret") != std::string::npos) ++refused;
      }
    });
  net::Fd garbage = net::connect_tcp(host, port, Clock::now() + std::chrono::seconds(2), "rank 0");
  const std::string http = "GET / HTTP/1.0\r\n\r\n";
  net::write_all(garbage.get(), http.data(), http.size(), Clock::now() + std::chrono::seconds(2), "rank 0");
  net::Fd silent = net::connect_tcp(host, port, Clock::now() + std::chrono::seconds(2), "rank 0");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all of them queued ahead of rank 1
  job.start(1, 2, {"--transport", "tcp", "--timeout-ms", "20000", "mismatch"});
  job.wait_exit();
  for (auto& t : attackers) t.join();
  EXPECT_EQ(refused.load(), 10);
  for (int r : {0, 1}) EXPECT_EQ(error_of(job[r].output()).kind, "MismatchError") << job[r].output();
  EXPECT_NE(job[0].output().find("refused 127.0.0.1:"), std::string::npos) << job[0].output();
}

// A scheduler's predictable id gets a tag only holders of the secret can compute.
TEST(Rendezvous, SchedulerJobIdsCarryATagFromTheSecret) {
  const std::string a = tagged_job_id("slurm-4711", "secret one"), b = tagged_job_id("slurm-4711", "secret two");
  EXPECT_TRUE(a.starts_with("slurm-4711-")) << a;
  EXPECT_EQ(a.size(), std::string("slurm-4711-").size() + 8) << a;
  EXPECT_NE(a, b);
  EXPECT_EQ(a, tagged_job_id("slurm-4711", "secret one"));
  EXPECT_NE(a, tagged_job_id("slurm-4712", "secret one"));
  EXPECT_EQ(tagged_job_id("slurm-4711", ""), "slurm-4711");
}

// Slurm's lists, as srun and sbatch set them: the first host of a node list, and this node's
// tasks from the compressed tasks-per-node form; what is not one is named.
TEST(Rendezvous, SlurmNodeListsAndTasksPerNode) {
  EXPECT_EQ(first_slurm_host("L", "node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(first_slurm_host("L", "n[1-2]"), "n1");
  EXPECT_EQ(first_slurm_host("L", "gpu5,node[01-04]"), "gpu5");
  EXPECT_EQ(first_slurm_host("L", "rack[3-4]-node[07,09]"), "rack3-node07");
  EXPECT_EQ(first_slurm_host("L", "login.cluster-1"), "login.cluster-1");
  for (const char* bad : {"node[01-04", "node]1[", "node[a-b]", "no de", "[", "", "n[1[2]]"}) {
    try {
      first_slurm_host("SLURM_JOB_NODELIST", bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(cat("SLURM_JOB_NODELIST='", bad, "': not a Slurm node list")), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(slurm_tasks_on_node("T", "2(x2)", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("T", "2(x2)", 1), 2);
  EXPECT_EQ(slurm_tasks_on_node("T", "2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("T", "4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("T", "3,1(x2),2", 3), 2);
  for (const auto& [bad, node] : std::vector<std::pair<std::string, int>>{{"2(x2)", 2}, {"2(x", 0}, {"x2", 0}, {"0", 0}, {"2(y3)", 0}, {"", 0}, {"2,,1", 1}}) {
    try {
      slurm_tasks_on_node("SLURM_TASKS_PER_NODE", bad, node);
      ADD_FAILURE() << bad << " was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(cat("SLURM_TASKS_PER_NODE='", bad, "'")), std::string::npos) << e.what();
    }
  }
  // The environment srun gives a task, without --ntasks-per-node: the local size is its
  // node's count, not 1.
  for (const auto& [k, v] : std::vector<std::pair<const char*, const char*>>{
           {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_LOCALID", "0"},
           {"SLURM_NODEID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "3,2"}, {"SLURM_TASKS_PER_NODE", "3,2"},
           {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_JOB_ID", "4711"}})
    ::setenv(k, v, 1);
  ::unsetenv("SLURM_NTASKS_PER_NODE");
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.size, 5);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.master_addr, "n1");
  EXPECT_EQ(e.master_port, 20000 + 4711);
  ::setenv("SLURM_STEP_NODELIST", "n[1-", 1);
  EXPECT_THROW(launch_env_from_environment(), InputError);
  for (const char* k : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_ID"})
    ::unsetenv(k);
}

// Placement the environment states is read where the environment is read (the launch
// boundary), never inside the transports: LOOM_HOST_ID.
TEST(Rendezvous, PlacementFromTheEnvironmentIsReadAtTheBoundary) {
  ::unsetenv("LOOM_HOST_ID");
  LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.host_id, "");
  ::setenv("LOOM_HOST_ID", "rack7-node3", 1);
  e = launch_env_from_environment();
  EXPECT_EQ(e.host_id, "rack7-node3");
  ::unsetenv("LOOM_HOST_ID");
}

TEST(Rendezvous, StaleJobDuplicateRankAndWorldSizeAreNamed) {
  {
    Job job;
    job.start(0, 2, {"mismatch"}, {{"LOOM_JOB_ID", "yesterday"}});
    job.wait_exit();
    ErrorLine e = error_of(job[0].output());
    EXPECT_EQ(e.kind, "AuthError") << job[0].output();
    EXPECT_NE(e.message.find("stale job"), std::string::npos) << e.message;
  }
  {
    Job job;
    int64_t start = now_ms();
    job.start(0, 3, {"mismatch"});
    job.start(1, 3, {"mismatch"});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    job.start(1, 3, {"mismatch"});
    job.wait_exit();
    ErrorLine dup = error_of(job[2].output());
    EXPECT_NE(dup.message.find("duplicate rank 1"), std::string::npos) << job[2].output();
    for (int r : {0, 1}) {
      ErrorLine e = error_of(job[r].output());
      EXPECT_NE(e.message.find("duplicate rank 1"), std::string::npos) << job[r].output();
      EXPECT_LT(e.ms - start, 2000);
    }
  }
  {
    Job job;
    job.start(0, 2, {"mismatch"});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    job.start(1, 3, {"mismatch"});
    job.wait_exit();
    for (int r : {0, 1}) {
      ErrorLine e = error_of(job[r].output());
      EXPECT_NE(e.message.find("world size disagreement"), std::string::npos) << job[r].output();
    }
  }
}

}  // namespace
}  // namespace loom::comm
