// The local ranks one launcher runs: forked with the torchrun-style environment, their
// output merged line by line with a `[rank R]` prefix, reaped, and torn down together when
// one fails (docs/launch.md). `loom launch` runs one group; an elastic launcher runs one per
// generation of the job.
//
// Thread-safety: one thread drives a group. Signals reach the launcher through
// `signal_fd()` (installed once, for SIGINT, SIGTERM and SIGCHLD).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom::comm {
class Store;
}

namespace loom::launch {

// Installs the launcher's handlers (SIGINT, SIGTERM, SIGCHLD write their number to a
// pipe; SIGPIPE ignored) and returns the pipe's read end. Idempotent.
int signal_fd();
// Waits up to `ms` for signals to the launcher; those that came (SIGCHLD left out).
std::vector<int> wait_for_signals(int ms);

// The per-job secret in a file that never has a name (O_TMPFILE, or one unlinked at once),
// mode 0600, reached by ranks through the inherited descriptor as /proc/self/fd/N.
struct SecretFile {
  int fd = -1;
  std::string path;  // /proc/self/fd/N
};
SecretFile make_secret_file(const std::string& secret);

struct RankGroupSpec {
  std::vector<std::string> command;
  int first_rank = 0, count = 1, world = 1, group_rank = 0;
  std::string store_host;
  int store_port = 0;
  std::string job_id;
  SecretFile secret;
  std::vector<std::pair<std::string, std::string>> env;  // more variables for every rank
  std::set<int> clean_exits = {0};  // exit codes that are not failures
  // A rank that declared itself expendable in the job's store (expendable_key; parameter-
  // server workers in async and ssp mode do) may fail alone: logged, the others go on.
  bool allow_expendable = false;
  // `loom launch --bind cores`: each rank's CPU affinity set to its share of the launcher's
  // (bind_cpus), before it runs anything.
  bool bind = false;
};

// `ranks` disjoint CPU sets that share out the CPUs this process may run on: whole cores
// (a core's SMT siblings together, from sysfs's thread_siblings_list), as evenly as they
// go, in the order of their first CPU; CPU by CPU where there are fewer cores than ranks.
// InputError naming --bind where there are fewer CPUs than ranks.
std::vector<std::vector<int>> bind_cpus(int ranks);
// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list(const std::vector<int>& cpus);

// The store key through which a rank tells its launcher it may fail alone.
std::string expendable_key(int rank);

class RankGroup {
 public:
  using Clock = std::chrono::steady_clock;
  struct Failure {
    int rank = 0;
    pid_t pid = -1;
    int code = 0;  // exit status, or 128 + signal
    bool signaled = false;  // killed by a signal the launcher did not send
    Clock::time_point at;
    std::string describe() const;  // "rank R (pid P) failed with signal S" / "exit code C"
  };

  explicit RankGroup(const RankGroupSpec& spec);  // forks every rank
  ~RankGroup();  // SIGKILLs and reaps ranks still running
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  // Waits up to `ms` for output, exits or a signal; copies ranks' output lines to stdout
  // and reaps. After the first failure the others get 0.5 s to exit on their own (a
  // surviving `loom train` rank names the dead peer), then SIGTERM, and SIGKILL 1.5 s after
  // the failure. Returns the signals the launcher received.
  std::vector<int> pump(int ms);
  // Sends `sig` to every live rank; SIGKILL follows after `grace` unless they exit.
  void forward(int sig, std::chrono::milliseconds grace);
  void signal(int sig);  // to every live rank, and nothing follows
  // Tears the group down as after a failure: 0.5 s, SIGTERM, SIGKILL at 1.5 s.
  void stop();
  bool done() const;  // every rank reaped and its output drained
  const std::optional<Failure>& failure() const { return failure_; }
  std::vector<int> exit_codes() const;  // per local rank, once done (0 for an expendable rank that failed)
  std::vector<pid_t> pids() const;

 private:
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    int out_fd = -1;      // merged stdout + stderr
    std::string partial;  // bytes after the last newline
    bool exited = false;
    bool signaled_by_us = false;  // teardown signals, not a forwarded SIGTERM
    int code = 0;
  };
  void emit(Child& c, const char* data, size_t n, bool flush_partial);
  void teardown_after(Clock::time_point from);
  void reap();
  bool expendable(int rank);

  RankGroupSpec spec_;
  std::unique_ptr<comm::Store> store_;  // the job's, opened when a rank fails (allow_expendable)
  std::vector<Child> children_;
  std::optional<Failure> failure_;
  Clock::time_point deadline_term_ = Clock::time_point::max(), deadline_kill_ = Clock::time_point::max();
  int open_pipes_ = 0;
};

}  // namespace loom::launch
