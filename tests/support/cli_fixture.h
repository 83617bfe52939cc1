// The loom binary as a test sees it: a per-test directory with a small corpus and a
// gpt-nano config (nano.toml), commands run with their exit code, stdout and stderr, a
// fingerprint of a directory's files, and the bad-input expectation every CLI test uses.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "loom/checkpoint/checkpoint.h"
#include "loom/data/data.h"
#include "loom/core/fileio.h"
#include "loom/checkpoint/safetensors.h"
#include "loom_testing.h"

namespace loom {

struct Result {
  int code;
  std::string out, err;
  int64_t peak_rss = 0;  // the command's peak resident memory, bytes
};

class Cli : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    // Every loom this test runs takes the host to have 16 GiB free, whatever it has: a check
    // against memory gives one verdict on any machine (docs/errors.md). A budget the runner
    // set (./test.sh --machine) stands.
    ::setenv("LOOM_HOST_MEMORY", "16G", /*overwrite=*/0);
    // A small byte-level corpus: enough windows for gpt-nano.
    std::string text;
    for (int i = 0; i < 400; ++i) text += "The quick brown fox " + std::to_string(i) + " jumps over the lazy dog.\n";
    std::vector<uint16_t> toks = data::byte_tokenize(text);
    data::write_tokens(p("train.bin"), toks);
    data::write_tokens(p("val.bin"), std::vector<uint16_t>(toks.begin(), toks.begin() + 2000));
    write(p("nano.toml"), cat("[job]\nname = \"r\"\nrun_dir = \"", p("runs"),
                              "\"\nthreads = 1\n[model]\npreset = \"gpt-nano\"\n[data]\ntrain = \"", p("train.bin"),
                              "\"\nval = \"", p("val.bin"), "\"\n[training]\nsteps = 6\nglobal_batch = 4\n"
                              "micro_batch = 2\nwarmup_steps = 2\neval_every = 3\neval_steps = 2\n"
                              "[checkpoint]\nevery = 3\nkeep = 5\n"));
  }
  std::string p(const std::string& name) const { return path(name); }
  static void write(const std::string& path, const std::string& s) { std::ofstream(path, std::ios::binary) << s; }

  // Runs `loom ARGS` (through sh): its exit code, output, and peak memory (wait4 gives the
  // shell's, which counts the largest of the children it waited for: loom).
  Result loom(const std::string& args) const {
    const std::string out_path = p(".loom_stdout"), err_path = p("stderr.txt");
    const std::string cmd = cat(LOOM_BINARY_DIR, "/loom ", args, " >", out_path, " 2>", err_path);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    rusage usage{};
    while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {}
    auto slurp = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out_path), slurp(err_path),
            static_cast<int64_t>(usage.ru_maxrss) * 1024};
  }

  // Every file under the run directory with its contents: a fingerprint of "untouched".
  std::string snapshot(const std::string& root) const {
    std::string s;
    if (!std::filesystem::exists(root)) return "absent";
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    // .lock names the last process that claimed the directory, not anything it holds.
    std::erase_if(files, [](const std::string& f) { return f.ends_with("/.lock"); });
    for (const auto& f : files) {
      std::error_code ec;
      const bool regular = std::filesystem::is_regular_file(f, ec) && !std::filesystem::is_symlink(f, ec);
      const uintmax_t size = regular ? std::filesystem::file_size(f, ec) : 0;
      // Files too big to hash (a sparse test file) are told by their size.
      s += f + "\n" + (!regular ? "not a regular file" : size > (uintmax_t{1} << 28) ? cat("size ", size) : sha256_hex(read_file(f))) + "\n";
    }
    return s;
  }

  void kill_and_resume(const std::string& train, const std::string& steps, std::initializer_list<std::string> fragments);

  // `loom launch ARGS` started in the background, its output to `out`; the launcher's pid.
  pid_t launch_in_background(const std::string& args, const std::string& out) const {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string cmd = cat("exec ", LOOM_BINARY_DIR, "/loom launch ", args, " > ", out, " 2>&1");
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }
  // Sends `sig` to `target` (a rank or the launcher), then waits for `launcher` to end: its
  // wait status and the seconds from the signal to its end.
  struct Ended {
    int status = 0;
    double seconds = 0;
  };
  static Ended signal_and_wait(pid_t target, int sig, pid_t launcher) {
    Ended e;
    EXPECT_EQ(::kill(target, sig), 0);
    const auto sent = std::chrono::steady_clock::now();
    EXPECT_EQ(::waitpid(launcher, &e.status, 0), launcher);
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    return e;
  }
  // The lines of `path` (0 when it does not exist yet).
  static int64_t line_count(const std::string& path) {
    std::ifstream f(path);
    return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
  }
  // Waits up to 30 s for `path` to hold n lines.
  static void wait_for_lines(const std::string& path, int64_t n) {
    for (int i = 0; i < 6000 && line_count(path) < n; ++i) ::usleep(5000);
  }

  // Bad input: exit 2, exactly one line on stderr containing every fragment, run dir untouched.
  void expect_bad_input(const std::string& args, std::initializer_list<std::string> fragments) {
    const std::string before = snapshot(p("runs"));
    Result r = loom(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("loom: error: ")) << r.err;
    for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "missing '" << f << "' in: " << r.err;
    EXPECT_EQ(snapshot(p("runs")), before) << args;
  }
};

// The metrics columns that must be bitwise equal between two runs of the same training.
inline std::vector<std::string> loss_columns(const std::string& metrics) {
  std::vector<std::string> out;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(line.substr(0, line.find(", \"tokens\"")));
  return out;
}

// Every logical tensor of one part of a checkpoint (name, shape and f64 values), whatever
// layout wrote it: equal strings mean equal weights (or optimizer state), bit for bit.
inline std::string logical(const std::string& checkpoint_dir, checkpoint::Part part) {
  const checkpoint::Checkpoint c = checkpoint::Checkpoint::open(checkpoint_dir);
  std::vector<checkpoint::TensorInfo> ts = c.tensors();
  std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::string out;
  for (const checkpoint::TensorInfo& t : ts) {
    if (t.part != part) continue;
    const Tensor v = c.read(t.name, DType::kF64);
    out += t.name + " " + shape_str(t.shape) + "\n";
    out.append(static_cast<const char*>(v.raw()), v.nbytes());
  }
  return out;
}

// The values of one key on every metrics line that has it, as written.
// The number right after `key` in `text` (a figure of a log line), or -1 when key is absent.
inline double figure_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + key.size(), nullptr);
}

inline std::vector<std::string> column(const std::string& metrics, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"" + key + "\": ");
    if (at == std::string::npos) continue;
    const size_t from = at + key.size() + 4;
    out.push_back(line.substr(from, line.find_first_of(",}", from) - from));
  }
  return out;
}

// Each of `keys` on every metrics line of `got` within `tolerance` of `want`'s (same count).
inline void expect_columns_near(const std::string& want, const std::string& got, std::initializer_list<const char*> keys,
                         double tolerance, const std::string& what) {
  for (const char* key : keys) {
    const auto w = column(want, key), h = column(got, key);
    ASSERT_EQ(w.size(), h.size()) << what << " " << key;
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_NEAR(std::stod(h[i]), std::stod(w[i]), tolerance) << what << " " << key << " at line " << i;
  }
}

// /proc files report size 0: read them as streams.
inline std::string slurp_proc(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The children of `parent`, from /proc.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    const std::string stat = slurp_proc(e.path().string() + "/stat");
    if (stat.rfind(')') == std::string::npos) continue;
    std::istringstream in(stat.substr(stat.rfind(')') + 2));  // pid (comm) state ppid ...
    std::string state;
    pid_t ppid = 0;
    in >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// A TCP port on 127.0.0.1 that was free a moment ago (for a --master HOST:PORT).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The pid of the launcher's child that has RANK=rank in its environment, or -1.
inline pid_t rank_pid(pid_t launcher, int rank) {
  for (pid_t pid : children_of(launcher)) {
    const std::string env = slurp_proc(cat("/proc/", pid, "/environ"));
    if (("\0" + env).find(cat(std::string(1, '\0'), "RANK=", rank, std::string(1, '\0'))) != std::string::npos)
      return pid;
  }
  return -1;
}

}  // namespace loom
