#include "loom/checkpoint/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/checkpoint/bounded_json.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/checkpoint/outputs.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".lock";

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

// Opens dir/.lock (creating it) and takes its lock without waiting: the descriptor, or -1
// when another process holds it.
int try_lock(const fs::path& dir) {
  const std::string path = (dir / kLockFile).string();
  const int fd = static_cast<int>(sys_check(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644), "open", path));
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  ::close(fd);
  if (err == EWOULDBLOCK) return -1;
  errno = err;
  sys_check(-1, "flock", path);
  return -1;
}

// Names this process in the lock file it holds.
void write_holder(int fd, const fs::path& dir) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string line = cat("pid ", ::getpid(), " on host ", host, " since ", utc_now("%Y-%m-%dT%H:%M:%SZ"), "\n");
  const std::string path = (dir / kLockFile).string();
  sys_check(::ftruncate(fd, 0), "ftruncate", path);
  sys_check(::pwrite(fd, line.data(), line.size(), 0), "write", path);
}

[[noreturn]] void refuse_held(const fs::path& dir) {
  throw InputError(cat(dir.string(), ": in use by another job (", lock_holder(dir.string()),
                       "); wait for it to end, or set job.name or job.run_dir"));
}

// `dir` exists where a fresh run wants it: named as held when a job holds it, else as there.
[[noreturn]] void refuse_taken(const fs::path& dir) {
  if (const int held = try_lock(dir); held < 0) refuse_held(dir);
  else ::close(held);
  throw InputError(cat(dir.string(), ": run directory exists; pass --resume to continue it, --restart to start afresh "
                       "(the old directory is kept aside), or set job.name or job.run_dir"));
}

// Creates `dir` holding this process's lock. The directory is built under a temporary name
// with its lock taken and renamed into place only if nothing is there, so that of two jobs
// starting together exactly one gets it and the other sees it locked.
int create_locked(const fs::path& dir) {
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent);
  const fs::path tmp = parent / cat(".", dir.filename().string(), ".claim-", ::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  const int fd = try_lock(tmp);
  LOOM_CHECK(fd >= 0);  // nobody else knows this directory
  write_holder(fd, tmp);
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) == 0) return fd;
  int err = errno;
  if (err == EINVAL) {  // a filesystem without RENAME_NOREPLACE: mkdir is atomic too
    if (::mkdir(dir.c_str(), 0755) == 0) {
      fs::rename(tmp / kLockFile, dir / kLockFile);  // the lock is on the file, which moves
      fs::remove_all(tmp);
      return fd;
    }
    err = errno;
  }
  ::close(fd);
  fs::remove_all(tmp);
  if (err != EEXIST && err != ENOTEMPTY) {
    errno = err;
    sys_check(-1, "rename", dir.string());
  }
  refuse_taken(dir);
}

// The lock of a directory the job writes into but that may already exist.
int lock_existing(const fs::path& dir) {
  const int fd = try_lock(dir);
  if (fd < 0) refuse_held(dir);
  write_holder(fd, dir);
  return fd;
}

// A separate checkpoint.dir names, in `.owner`, the run directory whose checkpoints it
// holds: the job of another run is refused it, also once the owner's job has ended (its
// lock is free then). REQUIRES: this process holds dir's lock.
void claim_owner(const fs::path& dir, const fs::path& run) {
  const std::string path = (dir / ".owner").string();
  std::error_code ec;
  const fs::path mine = fs::weakly_canonical(fs::absolute(run), ec);
  if (path_exists(path)) {
    std::string owner = read_file(path, 4096);
    while (!owner.empty() && owner.back() == '\n') owner.pop_back();
    if (owner != mine.string())
      throw InputError(cat("checkpoint.dir = \"", printable(dir.string()), "\": holds the checkpoints of run ",
                           printable(owner), " (", printable(path), "), not of this run's ", printable(mine.string()),
                           "; expected a directory of this run's own"));
    return;
  }
  write_file_atomic(path, mine.string() + "\n");
}

}  // namespace

std::string lock_holder(const std::string& dir) {
  std::string text;
  try {
    text = read_file((fs::path(dir) / kLockFile).string(), 4096);
  } catch (const Error&) {
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "a process that has not named itself yet" : printable(text);
}

RunDirectory RunDirectory::claim(const std::string& path, Mode mode, const std::string& extra_lock) {
  try {
    return claim_unchecked(path, mode, extra_lock);
  } catch (const fs::filesystem_error& e) {  // e.g. job.run_dir is a file, or not writable
    throw InputError(cat(path, ": cannot claim the run directory: ", e.code().message(), " (", e.path1().string(), ")"));
  }
}

RunDirectory RunDirectory::claim_unchecked(const std::string& path, Mode mode, const std::string& extra_lock) {
  RunDirectory r;
  r.path_ = path;
  const fs::path dir(path);
  std::error_code ec;
  const fs::file_type kind = fs::symlink_status(dir, ec).type();
  const bool exists = kind != fs::file_type::not_found;
  if (exists && kind != fs::file_type::directory)
    throw InputError(cat(path, ": exists and is not a directory; expected a run directory"));
  if (mode == Mode::kResume && !exists)
    throw InputError(cat(path, ": --resume given but the run directory does not exist"));
  if (mode == Mode::kFresh && exists) refuse_taken(dir);
  if (!extra_lock.empty()) {
    check_checkpoint_dir(extra_lock, path);
    fs::create_directories(extra_lock);
    r.extra_fd_ = lock_existing(extra_lock);  // closed by r's destructor if what follows throws
    claim_owner(extra_lock, dir);
  }
  if (mode == Mode::kResume) {
    r.lock_fd_ = lock_existing(dir);
    return r;
  }
  if (mode == Mode::kRestart && exists) {
    const int old = try_lock(dir);
    if (old < 0) refuse_held(dir);
    const std::string stem = cat(path, ".old-", utc_now("%Y%m%d-%H%M%S"));
    std::string aside = stem;
    for (int n = 2; fs::exists(aside, ec); ++n) aside = cat(stem, "-", n);
    const int moved = ::renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, aside.c_str(), RENAME_NOREPLACE);
    const int err = errno;
    ::close(old);
    if (moved != 0) {
      errno = err;
      sys_check(-1, "rename", cat(path, " to ", aside));
    }
    r.moved_aside_ = aside;
  }
  r.lock_fd_ = create_locked(dir);
  r.created_ = true;
  return r;
}

RunDirectory::RunDirectory(RunDirectory&& other) noexcept
    : path_(std::move(other.path_)), moved_aside_(std::move(other.moved_aside_)), lock_fd_(other.lock_fd_),
      extra_fd_(other.extra_fd_), created_(other.created_) {
  other.lock_fd_ = other.extra_fd_ = -1;
}

RunDirectory::~RunDirectory() {
  if (extra_fd_ >= 0) ::close(extra_fd_);
  if (lock_fd_ < 0) return;
  // A run this process created that failed before writing anything leaves no directory
  // behind to refuse the next attempt.
  if (created_ && std::uncaught_exceptions() > 0) {
    std::error_code ec;
    bool empty = true;
    for (const auto& e : fs::directory_iterator(path_, ec))
      if (e.path().filename() != kLockFile) empty = false;
    if (!ec && empty) fs::remove_all(path_, ec);
  }
  ::close(lock_fd_);
}

int64_t truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return 0;
  int64_t reached = 0;
  std::string kept, all = read_file(path);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line is dropped
    std::string line = all.substr(pos, nl - pos + 1);
    try {  // a line that is not a metrics object is dropped
      const nlohmann::json j = parse_json_bounded(line, path, kMetricsLineLimits);
      const int64_t step = j.is_object() ? j.value("step", int64_t{0}) : last_step + 1;
      if (j.is_object()) reached = std::max(reached, step);
      if (step <= last_step) kept += line;
    } catch (const Error&) {
    } catch (const nlohmann::json::exception&) {
    }
    pos = nl + 1;
  }
  write_file_atomic(path, kept);
  return reached;
}

}  // namespace loom::checkpoint
