#include "loom/launch/rank_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/comm/rendezvous.h"

namespace loom::launch {
namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  char c = static_cast<char>(sig);
  [[maybe_unused]] auto n = ::write(g_signal_pipe[1], &c, 1);
}

}  // namespace

int signal_fd() {
  if (g_signal_pipe[0] >= 0) return g_signal_pipe[0];
  sys_check(::pipe2(g_signal_pipe, O_NONBLOCK | O_CLOEXEC), "pipe2", "signals");
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGCHLD, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return g_signal_pipe[0];
}

namespace {

std::vector<int> read_signals() {
  std::vector<int> signals;
  char sigs[64];
  const ssize_t n = ::read(signal_fd(), sigs, sizeof sigs);
  for (ssize_t k = 0; k < n; ++k)
    if (sigs[k] != SIGCHLD) signals.push_back(sigs[k]);
  return signals;
}

}  // namespace

std::vector<int> wait_for_signals(int ms) {
  pollfd p{signal_fd(), POLLIN, 0};
  ::poll(&p, 1, ms);
  return (p.revents & POLLIN) ? read_signals() : std::vector<int>{};
}

SecretFile make_secret_file(const std::string& secret) {
  // Nothing of the secret is ever on disk under a name, so nothing remains whatever ends
  // the launcher, SIGKILL included.
  const std::string tmp = std::filesystem::temp_directory_path().string();
  int fd = static_cast<int>(::open(tmp.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd < 0) {  // a filesystem without O_TMPFILE
    std::string name = tmp + "/loom-secret-XXXXXX";
    fd = static_cast<int>(sys_check(::mkostemp(name.data(), O_CLOEXEC), "mkostemp", name));
    ::unlink(name.c_str());
  }
  sys_check(::fchmod(fd, 0600), "fchmod", "the secret file");
  sys_check(::write(fd, secret.data(), secret.size()), "write", "the secret file");
  return {.fd = fd, .path = cat("/proc/self/fd/", fd)};
}

std::string RankGroup::Failure::describe() const {
  return cat("rank ", rank, " (pid ", pid, ") failed with ", code > 128 ? "signal " : "exit code ",
             code > 128 ? code - 128 : code);
}

namespace {

// The CPUs listed in a sysfs list ("0-3,8"); empty where it cannot be read.
std::vector<int> read_cpu_list(const std::string& path) {
  std::vector<int> out;
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error&) {
    return out;
  }
  size_t at = 0;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) {
    const int lo = std::atoi(text.c_str() + at);
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
    int hi = lo;
    if (at < text.size() && text[at] == '-') {
      hi = std::atoi(text.c_str() + ++at);
      while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    if (at < text.size() && text[at] == ',') ++at;
  }
  return out;
}

}  // namespace

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += cat(out.empty() ? "" : ",", cpus[i], j > i ? cat("-", cpus[j]) : "");
    i = j + 1;
  }
  return out;
}

std::vector<std::vector<int>> bind_cpus(int ranks) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0)
    throw RuntimeError(cat("loom launch --bind: sched_getaffinity failed: ", std::strerror(errno)));
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  if (static_cast<int>(allowed.size()) < ranks)
    throw InputError(cat("loom launch --bind cores: ", ranks, " local ranks, but this launcher may run on only ",
                         allowed.size(), " CPU(s) (", cpu_list(allowed), "); run fewer ranks or leave out --bind"));
  // Cores: each allowed CPU with its allowed siblings, once, in the order of their first CPU.
  std::vector<std::vector<int>> cores;
  std::vector<bool> placed(CPU_SETSIZE, false);
  for (int c : allowed) {
    if (placed[c]) continue;
    std::vector<int> core;
    for (int s : read_cpu_list(cat("/sys/devices/system/cpu/cpu", c, "/topology/thread_siblings_list")))
      if (s >= 0 && s < CPU_SETSIZE && CPU_ISSET(s, &set) && !placed[s]) core.push_back(s);
    if (std::find(core.begin(), core.end(), c) == core.end()) core = {c};  // sysfs silent or odd
    for (int s : core) placed[s] = true;
    cores.push_back(std::move(core));
  }
  if (static_cast<int>(cores.size()) < ranks) {  // fewer cores than ranks: CPU by CPU
    cores.clear();
    for (int c : allowed) cores.push_back({c});
  }
  std::vector<std::vector<int>> out(static_cast<size_t>(ranks));
  const int64_t n = static_cast<int64_t>(cores.size());
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = r * n / ranks; i < (r + 1) * n / ranks; ++i)
      out[r].insert(out[r].end(), cores[i].begin(), cores[i].end());
    std::sort(out[r].begin(), out[r].end());
  }
  return out;
}

RankGroup::RankGroup(const RankGroupSpec& spec) : spec_(spec) {
  signal_fd();
  // Each rank's CPUs as a mask and a list, made here: a forked child only sets them.
  std::vector<cpu_set_t> masks(spec.bind ? static_cast<size_t>(spec.count) : 0);
  std::vector<std::string> lists(masks.size());
  if (spec.bind) {
    const std::vector<std::vector<int>> cpus = bind_cpus(spec.count);
    std::string where;
    for (int i = 0; i < spec.count; ++i) {
      CPU_ZERO(&masks[i]);
      for (int cpu : cpus[i]) CPU_SET(cpu, &masks[i]);
      lists[i] = cpu_list(cpus[i]);
      where += cat(i == 0 ? "" : ", ", "rank ", spec.first_rank + i, " on CPUs ", lists[i]);
    }
    std::fprintf(stderr, "loom launch: bound to cores: %s\n", where.c_str());
  }
  children_.resize(static_cast<size_t>(spec.count));
  const pid_t launcher_pid = ::getpid();
  for (int i = 0; i < spec.count; ++i) {
    Child& c = children_[i];
    c.rank = spec.first_rank + i;
    int fds[2];
    sys_check(::pipe2(fds, O_CLOEXEC), "pipe2", "rank output");
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
      if (spec.bind && ::sched_setaffinity(0, sizeof(cpu_set_t), &masks[i]) != 0) {
        std::fprintf(stderr, "loom launch: cannot bind rank %d to CPUs %s: %s\n", c.rank, lists[i].c_str(),
                     std::strerror(errno));
        ::_exit(127);
      }
      ::setenv("RANK", std::to_string(c.rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(spec.world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(spec.count).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(spec.group_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", spec.store_host.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(spec.store_port).c_str(), 1);
      ::setenv("LOOM_LAUNCHER", "1", 1);
      ::setenv("LOOM_STORE_HOSTED", "1", 1);
      ::setenv("LOOM_JOB_ID", spec.job_id.c_str(), 1);
      ::setenv("LOOM_SECRET_FILE", spec.secret.path.c_str(), 1);
      for (const auto& [k, v] : spec.env) ::setenv(k.c_str(), v.c_str(), 1);
      ::fcntl(spec.secret.fd, F_SETFD, 0);  // inherited by this rank only
      ::unsetenv("LOOM_SECRET");
      std::vector<char*> argv;
      for (const auto& s : spec.command) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "loom launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    c.pid = pid;
    c.out_fd = fds[0];
    ++open_pipes_;
  }
}

RankGroup::~RankGroup() {
  for (auto& c : children_) {
    if (!c.exited) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
    }
    if (c.out_fd >= 0) ::close(c.out_fd);
  }
}

void RankGroup::emit(Child& c, const char* data, size_t n, bool flush_partial) {
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

void RankGroup::teardown_after(Clock::time_point from) {
  deadline_term_ = std::min(deadline_term_, from + std::chrono::milliseconds(500));
  deadline_kill_ = std::min(deadline_kill_, from + std::chrono::milliseconds(1500));
}

void RankGroup::reap() {
  // Of the failures one pass finds, a rank killed by a signal is named first: a peer that
  // noticed its death and exited with an error may be reaped in the same pass, but the
  // killed rank died before it.
  std::optional<Failure> pass;
  for (auto& c : children_) {
    if (c.exited) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.exited = true;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (spec_.clean_exits.count(c.code) != 0) continue;
    const bool signaled = WIFSIGNALED(status) && !c.signaled_by_us;
    if (!failure_ && expendable(c.rank)) {
      std::fprintf(stderr, "loom launch: %s; it declared itself expendable (a parameter-server worker), so the job goes on\n",
                   Failure{.rank = c.rank, .pid = c.pid, .code = c.code, .signaled = signaled}.describe().c_str());
      c.code = 0;
      continue;
    }
    if (!pass || (signaled && !pass->signaled))
      pass = Failure{.rank = c.rank, .pid = c.pid, .code = c.code, .signaled = signaled, .at = Clock::now()};
  }
  if (!pass) return;
  if (!failure_) {
    failure_ = pass;
    teardown_after(pass->at);
  } else if (pass->signaled && !failure_->signaled && pass->at < failure_->at + std::chrono::milliseconds(250)) {
    // A killed process stops being readable (its peers see it gone) a moment before its
    // parent can reap it, so a peer that noticed may exit first: the killed rank is the
    // one to name.
    pass->at = failure_->at;
    failure_ = pass;
  }
}

std::vector<int> RankGroup::pump(int ms) {
  reap();
  // Teardown: a rank these signals end did not fail on its own.
  for (auto [deadline, sig] : {std::pair{&deadline_term_, SIGTERM}, std::pair{&deadline_kill_, SIGKILL}}) {
    if (Clock::now() < *deadline) continue;
    for (auto& c : children_)
      if (!c.exited) {
        c.signaled_by_us = true;
        ::kill(c.pid, sig);
      }
    *deadline = Clock::time_point::max();
  }
  std::vector<pollfd> fds{{signal_fd(), POLLIN, 0}};
  std::vector<Child*> who;
  for (auto& c : children_)
    if (c.out_fd >= 0) {
      fds.push_back({c.out_fd, POLLIN, 0});
      who.push_back(&c);
    }
  ::poll(fds.data(), fds.size(), ms);
  std::vector<int> signals = (fds[0].revents & POLLIN) ? read_signals() : std::vector<int>{};
  for (size_t k = 1; k < fds.size(); ++k) {
    if (!fds[k].revents) continue;
    Child& c = *who[k - 1];
    char buf[65536];
    const ssize_t n = ::read(c.out_fd, buf, sizeof buf);
    if (n > 0) {
      emit(c, buf, static_cast<size_t>(n), false);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      emit(c, "", 0, true);
      ::close(c.out_fd);
      c.out_fd = -1;
      --open_pipes_;
    }
  }
  reap();
  return signals;
}

void RankGroup::signal(int sig) {
  for (auto& c : children_)
    if (!c.exited) ::kill(c.pid, sig);
}

void RankGroup::forward(int sig, std::chrono::milliseconds grace) {
  signal(sig);
  deadline_kill_ = std::min(deadline_kill_, Clock::now() + grace);
}

void RankGroup::stop() { teardown_after(Clock::now()); }

bool RankGroup::done() const {
  return open_pipes_ == 0 && std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.exited; });
}

std::string expendable_key(int rank) { return cat("launch/expendable/", rank); }

bool RankGroup::expendable(int rank) {
  if (!spec_.allow_expendable) return false;
  const auto deadline = comm::Clock::now() + std::chrono::seconds(2);
  try {
    if (!store_)
      store_ = std::make_unique<comm::TcpStore>(
          comm::TcpStoreConfig{.host = spec_.store_host, .port = spec_.store_port, .secret = read_file(spec_.secret.path),
                               .job_id = spec_.job_id},
          deadline);
    return store_->try_get(expendable_key(rank), deadline).has_value();
  } catch (const Error& e) {  // no answer: the rank is not known to be expendable
    std::fprintf(stderr, "loom launch: cannot ask the job's store whether rank %d is expendable: %s\n", rank, e.what());
    return false;
  }
}

std::vector<int> RankGroup::exit_codes() const {
  std::vector<int> codes;
  for (const auto& c : children_) codes.push_back(c.code);
  return codes;
}

std::vector<pid_t> RankGroup::pids() const {
  std::vector<pid_t> p;
  for (const auto& c : children_) p.push_back(c.pid);
  return p;
}

}  // namespace loom::launch
