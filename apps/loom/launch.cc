// loom launch: spawns local ranks with the torchrun-style environment, hosts the
// rendezvous store (node 0), prefixes output lines with the rank, forwards SIGINT and
// SIGTERM, and tears the job down when any rank fails (docs/launch.md).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "loom/fileio.h"
#include "loom/rendezvous.h"

namespace loom::app {
namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  char c = static_cast<char>(sig);
  [[maybe_unused]] auto n = ::write(g_signal_pipe[1], &c, 1);
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;    // merged stdout + stderr
  std::string partial;  // bytes after the last newline
  bool exited = false;
  int code = 0;  // exit status, or 128 + signal
};

void emit(Child& c, const char* data, size_t n, bool flush_partial) {
  c.partial.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = c.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(stdout, "[rank %d] %.*s\n", c.rank, static_cast<int>(nl - start), c.partial.data() + start);
  c.partial.erase(0, start);
  if (flush_partial && !c.partial.empty()) {
    std::fprintf(stdout, "[rank %d] %s\n", c.rank, c.partial.c_str());
    c.partial.clear();
  }
  std::fflush(stdout);
}

std::pair<std::string, int> parse_master(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InputError(cat("--master '", s, "' is not HOST:PORT"));
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535) throw InputError(cat("--master '", s, "': port must be 0..65535"));
  return {s.substr(0, colon), port};
}

}  // namespace

int run_launch(const LaunchArgs& a) {
  if (a.command.empty()) throw InputError("loom launch: no command given after --");
  if (a.nproc < 1) throw InputError(cat("loom launch: -n must be >= 1, got ", a.nproc));
  if (!(a.grace_s > 0 && a.grace_s < 1e6)) throw InputError(cat("loom launch: --grace ", a.grace_s, ": expected seconds in (0, 1e6)"));
  if (a.nnodes < 1 || a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw InputError(cat("loom launch: --node-rank ", a.node_rank, " is out of range for --nnodes ", a.nnodes));
  auto [host, port] = parse_master(a.master);
  if (a.nnodes > 1 && port == 0)
    throw InputError("loom launch: --nnodes > 1 needs --master HOST:PORT with a fixed port");

  // The per-job secret: given (multi-node jobs must share one), or generated here.
  comm::LaunchEnv given = comm::launch_env_from_environment();
  std::string secret = given.secret;
  if (secret.empty()) {
    if (a.nnodes > 1)
      throw InputError("loom launch: --nnodes > 1 needs the same LOOM_SECRET_FILE (mode 600) on every node");
    secret = comm::generate_secret();
  }
  std::string job_id = std::getenv("LOOM_JOB_ID") ? std::getenv("LOOM_JOB_ID")
                       : a.nnodes > 1 ? comm::tagged_job_id(cat("job-", host, "-", port), secret)
                                      : cat("job-", comm::generate_secret().substr(0, 16));
  // The secret reaches the ranks as an inherited descriptor of a file without a name
  // (O_TMPFILE, or one unlinked at once), read through /proc/self/fd: nothing of it is ever
  // on disk under a name, so nothing remains whatever ends the launcher, SIGKILL included.
  const std::string tmp = std::filesystem::temp_directory_path().string();
  int secret_fd = static_cast<int>(::open(tmp.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (secret_fd < 0) {  // a filesystem without O_TMPFILE
    std::string name = tmp + "/loom-secret-XXXXXX";
    secret_fd = static_cast<int>(sys_check(::mkostemp(name.data(), O_CLOEXEC), "mkostemp", name));
    ::unlink(name.c_str());
  }
  sys_check(::fchmod(secret_fd, 0600), "fchmod", "the secret file");
  sys_check(::write(secret_fd, secret.data(), secret.size()), "write", "the secret file");
  const std::string secret_file = cat("/proc/self/fd/", secret_fd);

  std::unique_ptr<comm::TcpStoreServer> server;
  if (a.node_rank == 0) {
    server = std::make_unique<comm::TcpStoreServer>(
        comm::TcpStoreConfig{.host = host, .port = port, .secret = secret, .job_id = job_id});
    port = server->port();
  }

  sys_check(::pipe2(g_signal_pipe, O_NONBLOCK | O_CLOEXEC), "pipe2", "signals");
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGCHLD, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const int world = a.nnodes * a.nproc;
  std::vector<Child> children(a.nproc);
  for (int i = 0; i < a.nproc; ++i) {
    Child& c = children[i];
    c.rank = a.node_rank * a.nproc + i;
    int fds[2];
    sys_check(::pipe2(fds, O_CLOEXEC), "pipe2", "rank output");
    const pid_t launcher_pid = ::getpid();
    pid_t pid = ::fork();
    sys_check(pid, "fork", cat("rank ", c.rank));
    if (pid == 0) {
      ::setpgid(0, 0);  // signals reach ranks only through the launcher
      // ... or from the kernel when the launcher dies without forwarding anything (SIGKILL):
      // a rank never outlives its launcher.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher_pid) ::_exit(128 + SIGTERM);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGCHLD, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      ::setenv("RANK", std::to_string(c.rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(a.nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(a.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", host.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("LOOM_LAUNCHER", "1", 1);
      ::setenv("LOOM_STORE_HOSTED", "1", 1);
      ::setenv("LOOM_JOB_ID", job_id.c_str(), 1);
      ::setenv("LOOM_SECRET_FILE", secret_file.c_str(), 1);
      ::fcntl(secret_fd, F_SETFD, 0);  // inherited by this rank only
      ::unsetenv("LOOM_SECRET");
      std::vector<char*> argv;
      for (const auto& s : a.command) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "loom launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    c.pid = pid;
    c.out_fd = fds[0];
  }

  int first_failure = -1;  // index into children
  bool first_signaled = false;
  std::chrono::steady_clock::time_point first_failure_at;
  auto terminate_others = [&] {
    for (auto& c : children)
      if (!c.exited) ::kill(c.pid, SIGTERM);
  };
  // After a failure the others get a moment to exit on their own (a survivor's error names
  // the dead peer and the step it was in), then SIGTERM, then SIGKILL: all within 2 s.
  auto deadline_term = std::chrono::steady_clock::time_point::max();
  auto deadline_kill = std::chrono::steady_clock::time_point::max();
  int open_pipes = a.nproc;
  while (true) {
    // Reap. Of the failures one pass finds, a rank killed by a signal is named first: a
    // peer that noticed its death and exited with an error may be reaped in the same pass,
    // but the killed rank died before it.
    int pass_failure = -1;
    bool pass_signaled = false;
    for (int i = 0; i < a.nproc; ++i) {
      Child& c = children[i];
      if (c.exited) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.exited = true;
      c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (c.code != 0 && (pass_failure < 0 || (WIFSIGNALED(status) && !pass_signaled))) {
        pass_failure = i;
        pass_signaled = WIFSIGNALED(status);
      }
    }
    if (pass_failure >= 0 && first_failure < 0) {
      first_failure = pass_failure;
      first_signaled = pass_signaled;
      first_failure_at = std::chrono::steady_clock::now();
      deadline_term = first_failure_at + std::chrono::milliseconds(500);
      deadline_kill = first_failure_at + std::chrono::milliseconds(1500);
    } else if (pass_failure >= 0 && pass_signaled && !first_signaled &&
               std::chrono::steady_clock::now() < first_failure_at + std::chrono::milliseconds(250)) {
      // A killed process stops being readable (its peers see it gone) a moment before its
      // parent can reap it, so a peer that noticed may exit first: the killed rank is the
      // one to name.
      first_failure = pass_failure;
      first_signaled = true;
    }
    bool all_exited = std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; });
    if (all_exited && open_pipes == 0) break;
    if (std::chrono::steady_clock::now() >= deadline_term) {
      terminate_others();
      deadline_term = std::chrono::steady_clock::time_point::max();
    }
    if (std::chrono::steady_clock::now() >= deadline_kill) {
      for (auto& c : children)
        if (!c.exited) ::kill(c.pid, SIGKILL);
      deadline_kill = std::chrono::steady_clock::time_point::max();
    }
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<int> idx;
    for (int i = 0; i < a.nproc; ++i)
      if (children[i].out_fd >= 0) {
        fds.push_back({children[i].out_fd, POLLIN, 0});
        idx.push_back(i);
      }
    ::poll(fds.data(), fds.size(), 50);
    if (fds[0].revents & POLLIN) {
      char sigs[64];
      ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof sigs);
      for (ssize_t k = 0; k < n; ++k)
        if (sigs[k] == SIGINT || sigs[k] == SIGTERM) {
          for (auto& c : children)
            if (!c.exited) ::kill(c.pid, sigs[k]);
          if (deadline_kill == std::chrono::steady_clock::time_point::max())
            deadline_kill = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(static_cast<int64_t>(a.grace_s * 1000));
        }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      Child& c = children[idx[k - 1]];
      char buf[65536];
      ssize_t n = ::read(c.out_fd, buf, sizeof buf);
      if (n > 0) {
        emit(c, buf, static_cast<size_t>(n), false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit(c, "", 0, true);
        ::close(c.out_fd);
        c.out_fd = -1;
        --open_pipes;
      }
    }
  }
  if (first_failure >= 0) {
    const Child& c = children[first_failure];
    std::fprintf(stderr, "loom launch: rank %d (pid %d) failed with %s %d; stopped the other ranks\n", c.rank,
                 c.pid, c.code > 128 ? "signal" : "exit code", c.code > 128 ? c.code - 128 : c.code);
    return c.code;
  }
  for (const auto& c : children)
    if (c.code != 0) return c.code;
  return 0;
}

}  // namespace loom::app
