// The run directory's one writer (DESIGN.md section 4, docs/formats.md "Run directory"). A
// job's rank 0 claims the run directory before it writes anything: an OS lock (flock) on
// its `.lock` file, held for the life of the process and released by the kernel when the
// process ends however it ends, so a killed job's lock never blocks the next run. The lock
// file names its holder (host, PID, start time) for the refusal of a second job.
// Thread-safety: one object per process.
#pragma once

#include <cstdint>
#include <string>

namespace loom::checkpoint {

class RunDirectory {
 public:
  enum class Mode {
    kFresh,    // the directory must not exist; it is created
    kResume,   // it must exist
    kRestart,  // an existing one is moved aside to <path>.old-<time>; a fresh one is created
  };
  // Claims `path` for this process. InputError (exit 2) when another job holds it (naming
  // the holder), when it exists for kFresh or is missing for kResume. `extra_lock`: a
  // directory outside `path` the job also writes (a separate checkpoint.dir), locked too;
  // refused when it lies in another run's directory or its `.owner` names another run
  // (it is written on the first claim).
  static RunDirectory claim(const std::string& path, Mode mode, const std::string& extra_lock = "");

  RunDirectory(RunDirectory&& other) noexcept;
  RunDirectory& operator=(RunDirectory&&) = delete;
  ~RunDirectory();

  const std::string& path() const { return path_; }
  // kRestart: where the old directory went; empty when there was none.
  const std::string& moved_aside() const { return moved_aside_; }

 private:
  RunDirectory() = default;
  static RunDirectory claim_unchecked(const std::string& path, Mode mode, const std::string& extra_lock);
  std::string path_, moved_aside_;
  int lock_fd_ = -1, extra_fd_ = -1;
  bool created_ = false;  // by this claim: removed again if nothing was written when the job fails
};

// Keeps the lines of the metrics file `path` of steps <= last_step (a resumed run rewrites
// what follows); torn or foreign lines go. Returns the last step the file had reached.
int64_t truncate_metrics(const std::string& path, int64_t last_step);

// The holder a lock file names, "pid P on host H since T", for messages.
std::string lock_holder(const std::string& dir);

}  // namespace loom::checkpoint
