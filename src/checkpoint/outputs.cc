#include "loom/checkpoint/outputs.h"

#include <sys/stat.h>

#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;

namespace {

// `path` made absolute with every link that exists resolved, for comparing places.
fs::path place(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

// Whether `inner` is `outer` or lies under it.
bool within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end() || (std::next(o) == outer.end() && o->empty());
}

void check_common(const std::string& flag, const std::string& out, const std::vector<std::string>& inputs) {
  if (out.empty()) throw InputError(cat(flag, ": expected a path to write"));
  const fs::path to = place(out);
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    const fs::path from = place(in);
    if (within(to, from) || within(from, to))
      throw InputError(cat(flag, " ", printable(out), ": ", to == from ? "is" : within(to, from) ? "lies inside" : "holds",
                           " the input ", printable(in), "; expected an output apart from what the command reads"));
  }
  if (const std::string held = locked_dir_holding(out); !held.empty())
    throw InputError(cat(flag, " ", printable(out), ": lies in ", printable(held),
                         ", a run's directory (it holds .lock) that only its own job writes; expected a path outside it"));
}

}  // namespace

std::string locked_dir_holding(const std::string& path) {
  for (fs::path p = place(path); !p.empty(); p = p.parent_path()) {
    if (path_exists((p / ".lock").string())) return p.string();
    if (p == p.root_path()) break;
  }
  return "";
}

void check_output_file(const std::string& flag, const std::string& out, const std::vector<std::string>& inputs) {
  check_common(flag, out, inputs);
  if (const std::string kind = non_regular_kind(out); !kind.empty())
    throw InputError(cat(flag, " ", printable(out), ": exists and is ", kind, "; expected a regular file to replace, or a "
                         "new path (it is left as it is)"));
}

void check_output_root(const std::string& flag, const std::string& out, const std::vector<std::string>& inputs) {
  check_common(flag, out, inputs);
  struct stat st{};
  if (::lstat(out.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode))
    throw InputError(cat(flag, " ", printable(out), ": exists and is ", S_ISREG(st.st_mode) ? "a file" : non_regular_kind(out),
                         "; expected a directory to write a checkpoint into"));
  const std::string latest = (fs::path(out) / "latest").string();
  if (!path_exists(latest)) {
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().filename().string().starts_with("step_"))
        throw InputError(cat(flag, " ", printable(out), ": holds ", printable(e.path().filename().string()),
                             " and no `latest`: someone's checkpoints; expected a new or empty directory"));
    return;
  }
  std::string names;
  try {
    names = read_file(latest, 256);
  } catch (const Error&) {
  }
  if (names != "step_0\n")
    throw InputError(cat(flag, " ", printable(out), ": holds a training run's checkpoints (", printable(latest),
                         " names ", printable(names.substr(0, names.find('\n'))),
                         "); expected a new directory, or one that prune or quantize wrote"));
}

void check_apart(const std::string& in_flag, const std::string& in, const std::string& out_flag, const std::string& out) {
  const fs::path from = place(in), to = place(out);
  if (within(to, from) || within(from, to))
    throw InputError(cat(in_flag, " ", printable(in), ": ", to == from ? "is" : within(from, to) ? "lies inside" : "holds", " ",
                         out_flag, " ", printable(out), ", where this job writes (and prunes) its checkpoints; expected "
                         "weights apart from them"));
}

void check_checkpoint_dir(const std::string& dir, const std::string& run) {
  const fs::path own = place(run);
  if (place(dir) != own && path_exists((fs::path(dir) / ".lock").string()) &&
      path_exists((fs::path(dir) / "config.toml").string()))
    throw InputError(cat("checkpoint.dir = \"", printable(dir), "\": is another run's directory (it holds .lock and "
                         "config.toml); expected a directory of this run's own"));
  for (fs::path p = place(dir); !p.empty(); p = p.parent_path()) {
    if (p != place(dir) && p != own && path_exists((p / ".lock").string()))
      throw InputError(cat("checkpoint.dir = \"", printable(dir), "\": lies in ", printable(p.string()),
                           ", another run's directory (it holds .lock), whose checkpoints only its own job writes; "
                           "expected a directory of this run's own"));
    if (p == p.root_path()) break;
  }
}

}  // namespace loom::checkpoint
