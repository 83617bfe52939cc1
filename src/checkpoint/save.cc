// Writing a checkpoint directory (docs/formats.md, "Checkpoint directories"): every rank's
// shards, then the lead's index, state, rename and `latest`.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>

#include "loom/checkpoint/bounded_json.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "schema.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

FaultHook& fault_hook() {
  static FaultHook hook;
  return hook;
}

void fault_point(std::string_view point, int64_t step) {
  if (fault_hook()) fault_hook()(point, step);
}

// Whether a step directory's state.json says its loss and weights were finite. Directories
// written before the key existed count as finite; unreadable ones do not.
bool finite_checkpoint(const fs::path& dir) {
  try {
    const std::string path = (dir / "state.json").string();
    const json state = parse_json_bounded(read_file(path, kStateJsonLimits.max_bytes), path, kStateJsonLimits);
    return state.is_object() && (!state.contains("finite") || state["finite"] == true);
  } catch (const Error&) {
    return false;
  }
}

// The step directories under `root` (step_N, N decimal), newest first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.size() > 5 && n.size() < 24 && n.starts_with("step_") &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      steps.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// The step `latest` names; nullopt when there is none or it cannot be read.
std::optional<int64_t> latest_step(const std::string& root) {
  try {
    const std::string path = (fs::path(root) / "latest").string();
    if (!path_exists(path)) return std::nullopt;
    return std::stoll(parse_latest(read_file(path, kMaxLatestBytes), path).substr(5));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Removes the step directories older than `latest`'s that are not among the newest `keep`
// up to and including it, sparing the newest finite one (a run that diverged never prunes
// the last checkpoint it could be resumed from). The step `latest` names and every step
// newer than it (renamed into place but never committed) are never removed; without a
// readable `latest` nothing is.
void prune(const std::string& root, int keep) {
  if (keep <= 0) return;
  const std::optional<int64_t> latest = latest_step(root);
  if (!latest) return;
  size_t kept = 0;
  bool finite_kept = false;
  for (const auto& [step, dir] : step_dirs(root)) {
    if (step > *latest) continue;
    const bool finite = !finite_kept && finite_checkpoint(dir);
    finite_kept = finite_kept || finite;
    if (step == *latest || kept < static_cast<size_t>(keep)) {
      ++kept;
      continue;
    }
    if (!finite) fs::remove_all(dir);
  }
}

// Renames step directory `dir` to "<dir>.set-aside-<UTC time>" (a name no reader or prune
// takes for a step) and returns the new path.
std::string set_aside(const fs::path& dir) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  fs::path to = dir.string() + ".set-aside-" + stamp;
  for (int i = 2; fs::exists(to); ++i) to = cat(dir.string(), ".set-aside-", stamp, "-", i);
  try {
    fs::rename(dir, to);
  } catch (const fs::filesystem_error& e) {
    throw RuntimeError(cat("rename(", dir.string(), ", ", to.string(), ") failed: ", e.code().message()));
  }
  return to.string();
}

template <typename T>
bool all_finite(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

bool all_finite(const Tensor& t) {
  if (t.dtype() == DType::kF64) return all_finite(t.data<double>(), t.numel());
  if (t.dtype() == DType::kF32) return all_finite(t.data<float>(), t.numel());
  return true;
}

// The tensor's name in its shard file: the logical name when the piece is all of it (a
// one-rank checkpoint's model file reads as a plain model), else name@offsets.
std::string shard_key(const Piece& p) {
  if (p.box.offsets == Shape(p.shape.size(), 0) && p.box.extents == p.shape) return p.name;
  std::string key = p.name + "@";
  for (size_t d = 0; d < p.box.offsets.size(); ++d) key += cat(d ? "," : "", p.box.offsets[d]);
  return key;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> set_aside_uncommitted(const std::string& root) {
  std::vector<std::pair<std::string, std::string>> moved;
  const std::optional<int64_t> latest = latest_step(root);
  if (!latest || !fs::is_directory(fs::path(root) / cat("step_", *latest))) return moved;
  for (const auto& [step, dir] : step_dirs(root))
    if (step > *latest) moved.emplace_back(dir.string(), set_aside(dir));
  if (!moved.empty()) fsync_dir(root);
  return moved;
}

void set_fault_hook(FaultHook hook) { fault_hook() = std::move(hook); }

std::string temp_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / cat(".step_", step, ".tmp")).string();
}

void begin_save(const std::string& root, int64_t step) {
  try {
    fs::create_directories(root);
    fs::remove_all(temp_dir(root, step));
    fs::create_directories(temp_dir(root, step));
  } catch (const fs::filesystem_error& e) {
    throw RuntimeError(cat(temp_dir(root, step), ": cannot create the checkpoint's directory: ", e.code().message()));
  }
}

json write_shard(const std::string& dir, const std::string& file, const std::vector<Piece>& pieces, Part part,
                int64_t step) {
  json tensors = json::array();
  if (pieces.empty()) return {{"tensors", tensors}};
  std::vector<TensorSpec> specs;
  int64_t largest_in_place = 0;  // elements
  DType in_place_dtype = DType::kF32;
  for (const Piece& p : pieces) {
    specs.push_back({shard_key(p), p.dtype(), p.box.extents});
    if (p.data.defined()) continue;
    LOOM_CHECK(largest_in_place == 0 || p.dtype() == in_place_dtype);
    largest_in_place = std::max(largest_in_place, p.box.numel());
    in_place_dtype = p.dtype();
  }
  // Pieces made in place pass through one buffer, the size of the largest.
  Tensor staging = largest_in_place > 0 ? Tensor::zeros({largest_in_place}, in_place_dtype) : Tensor();
  std::vector<std::string> sha(pieces.size());
  bool finite = true;
  const WrittenFile w = write_safetensors(
      (fs::path(dir) / file).string(), specs,
      [&](size_t i) {
        const Piece& p = pieces[i];
        Tensor t = p.data;
        if (!t.defined()) {
          p.fill(staging.raw());
          t = staging.slice_rows(0, p.box.numel()).view(p.box.extents);
        }
        const std::string_view bytes(static_cast<const char*>(t.raw()), t.nbytes());
        sha[i] = sha256_hex(bytes);
        finite = finite && all_finite(t);
        return bytes;
      },
      part == Part::kModel ? std::map<std::string, std::string>{{"format", "pt"}} : std::map<std::string, std::string>{});
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    tensors.push_back({{"name", p.name},
                       {"part", part == Part::kModel ? "model" : "optimizer"},
                       {"dtype", std::string(safetensors_dtype_name(p.dtype()))},
                       {"shape", p.shape},
                       {"key", specs[i].name},
                       {"offsets", p.box.offsets},
                       {"extents", p.box.extents},
                       {"sha256", sha[i]}});
  }
  fault_point("shard", step);
  return {{"file", file}, {"bytes", w.bytes}, {"sha256", w.sha256}, {"finite", finite}, {"tensors", tensors}};
}

std::string commit(const std::string& root, int64_t step, const std::vector<json>& records, const json& state,
                   const json& layout, std::optional<int64_t> optimizer_steps, const SaveOptions& options) {
  const std::string name = cat("step_", step);
  const fs::path final_dir = fs::path(root) / name, tmp_dir = temp_dir(root, step);
  json files = json::object();
  json tensors = json::array();
  std::map<std::string, size_t> where;  // tensor name -> its entry in `tensors`
  bool finite = options.loss_finite;
  for (const json& r : records) {
    if (r["tensors"].empty()) continue;
    files[r["file"].get<std::string>()] = {{"bytes", r["bytes"]}, {"sha256", r["sha256"]}};
    finite = finite && r["finite"].get<bool>();
    for (const json& t : r["tensors"]) {
      const std::string n = t["name"];
      auto [it, fresh] = where.emplace(n, tensors.size());
      if (fresh)
        tensors.push_back({{"name", n}, {"part", t["part"]}, {"dtype", t["dtype"]}, {"shape", t["shape"]}, {"shards", json::array()}});
      tensors[it->second]["shards"].push_back(
          {{"file", r["file"]}, {"key", t["key"]}, {"offsets", t["offsets"]}, {"extents", t["extents"]}, {"sha256", t["sha256"]}});
    }
  }
  auto write_text = [&](const std::string& file, const std::string& text) {
    write_file_atomic((tmp_dir / file).string(), text);
    return json{{"bytes", text.size()}, {"sha256", sha256_hex(text)}};
  };
  for (const auto& [name, bytes] : options.files) {
    LOOM_CHECK(is_extra_file(name, kFormatVersion));
    fs::create_directories((tmp_dir / name).parent_path());
    files[name] = write_text(name, bytes);
    fsync_dir((tmp_dir / name).parent_path().string());
  }
  json st = state;
  st["format"] = "loom-checkpoint";
  st["version"] = kFormatVersion;
  st["step"] = step;
  if (optimizer_steps) st["optimizer_steps"] = *optimizer_steps;
  st["finite"] = finite;
  files["state.json"] = write_text("state.json", st.dump(2) + "\n");
  fault_point("state", step);
  const json index = {{"format", "loom-checkpoint-index"}, {"version", kFormatVersion}, {"layout", layout.is_object() ? layout : json::object()},
                      {"tensors", tensors}, {"files", files}};
  const std::string index_text = index.dump(2) + "\n";
  write_text("index.json", index_text);
  write_text("index.sha256", sha256_hex(index_text) + "\n");  // any change to the index is found
  fsync_dir(tmp_dir.string());
  fault_point("index", step);
  // A directory already named step_N is a save of this step that was renamed but never
  // committed: it is set aside, never deleted.
  if (fs::exists(final_dir)) set_aside(final_dir);
  try {
    fs::rename(tmp_dir, final_dir);
  } catch (const fs::filesystem_error& e) {
    throw RuntimeError(cat("rename(", tmp_dir.string(), ", ", final_dir.string(), ") failed: ", e.code().message()));
  }
  fsync_dir(root);
  fault_point("renamed", step);
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  fault_point("latest", step);
  prune(root, options.keep);
  return final_dir.string();
}

std::string save(const std::string& root, int64_t step, const ParamSet& params, const optim::Optimizer* optimizer,
                 const json& state, const SaveOptions& options) {
  begin_save(root, step);
  const std::string dir = temp_dir(root, step);
  std::vector<json> records{
      write_shard(dir, "model-00000.safetensors", pieces(params, {{0, params.numel(), params.values().raw()}}), Part::kModel,
                  step)};
  std::optional<int64_t> steps;
  if (optimizer != nullptr) {
    std::vector<Piece> opt;
    for (const auto& [role, flat] : optimizer->state()) {
      LOOM_CHECK(flat.dtype() == params.dtype());
      for (Piece& p : pieces(params, {{0, params.numel(), flat.raw()}}, role + ".")) opt.push_back(std::move(p));
    }
    records.push_back(write_shard(dir, "optimizer-00000.safetensors", opt, Part::kOptimizer, step));
    steps = optimizer->steps();
  }
  return commit(root, step, records, state, {{"world", 1}}, steps, options);
}

}  // namespace loom::checkpoint
