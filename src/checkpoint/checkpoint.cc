#include "loom/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "loom/bounded_json.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "schema.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kModelFile = "model.safetensors";
const char* kOptimizerFile = "optimizer.safetensors";

json tensor_index(const std::string& file, const std::vector<std::pair<std::string, Tensor>>& ts) {
  json out = json::array();
  for (const auto& [name, t] : ts) {
    Shape zeros(t.shape().size(), 0);
    out.push_back({{"name", name},
                   {"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                   {"shape", t.shape()},
                   {"shards", {{{"file", file}, {"offsets", zeros}, {"extents", t.shape()}}}}});
  }
  return out;
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

// Removes all but the newest `keep` step directories, except the newest finite one: a run
// that diverged never prunes the last checkpoint it could be resumed from.
void prune(const std::string& root, int keep) {
  if (keep <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.size() > 5 && n.size() < 24 && n.starts_with("step_") &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      steps.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  bool finite_kept = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool finite = !finite_kept && finite_checkpoint(steps[i].second);
    finite_kept = finite_kept || finite;
    if (i >= static_cast<size_t>(keep) && !finite) fs::remove_all(steps[i].second);
  }
}

template <typename T>
bool all_finite(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

bool all_finite(const ParamSet& params) {
  const Tensor& v = params.values();
  if (v.dtype() == DType::kF64) return all_finite(v.data<double>(), v.numel());
  return all_finite(v.data<float>(), v.numel());
}

}  // namespace

namespace {

std::string save_impl(const std::string& root, int64_t step, const ParamSet& params,
                      const optim::FlatState* optimizer, const json& state, const SaveOptions& options) {
  fs::create_directories(root);
  const std::string name = "step_" + std::to_string(step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / ("." + name + ".tmp");
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  std::vector<std::pair<std::string, Tensor>> weights, opt_state;
  for (size_t i = 0; i < params.infos().size(); ++i)
    weights.emplace_back(params.infos()[i].name, params.value(static_cast<int>(i)));
  if (optimizer != nullptr)
    for (const auto& [role, flat] : optimizer->buffers)
      for (const ParamInfo& p : params.infos())
        opt_state.emplace_back(role + "." + p.name, flat.slice_rows(p.offset, p.offset + p.numel).view(p.shape));

  json files = json::object();
  auto add_file = [&](const std::string& file, const WrittenFile& w) {
    files[file] = {{"bytes", w.bytes}, {"sha256", w.sha256}};
  };
  auto write_text = [&](const std::string& file, const std::string& text) {
    write_file_atomic((tmp_dir / file).string(), text);
    return WrittenFile{text.size(), sha256_hex(text)};
  };
  add_file(kModelFile, write_safetensors((tmp_dir / kModelFile).string(), weights, {{"format", "pt"}}));
  json tensors = tensor_index(kModelFile, weights);
  if (optimizer != nullptr) {
    add_file(kOptimizerFile, write_safetensors((tmp_dir / kOptimizerFile).string(), opt_state));
    for (auto& t : tensor_index(kOptimizerFile, opt_state)) tensors.push_back(t);
  }
  json st = state;
  st["format"] = "loom-checkpoint";
  st["version"] = kFormatVersion;
  st["step"] = step;
  if (optimizer != nullptr) st["optimizer_steps"] = optimizer->steps;
  st["finite"] = options.loss_finite && all_finite(params);
  add_file("state.json", write_text("state.json", st.dump(2) + "\n"));
  json index = {{"format", "loom-checkpoint-index"}, {"version", kFormatVersion},
                {"tensors", tensors}, {"files", files}};
  write_text("index.json", index.dump(2) + "\n");
  fsync_dir(tmp_dir.string());

  fs::remove_all(final_dir);  // only a stale copy of the same step can be here
  fs::rename(tmp_dir, final_dir);
  fsync_dir(root);
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  prune(root, options.keep);
  return final_dir.string();
}

}  // namespace

std::string save(const std::string& root, int64_t step, const ParamSet& params,
                 const optim::Optimizer* optimizer, const json& state, const SaveOptions& options) {
  if (optimizer == nullptr) return save_impl(root, step, params, nullptr, state, options);
  const optim::FlatState flat{.buffers = optimizer->state(), .steps = optimizer->steps()};
  return save_impl(root, step, params, &flat, state, options);
}

std::string save(const std::string& root, int64_t step, const ParamSet& params,
                 const optim::FlatState& optimizer, const json& state, const SaveOptions& options) {
  return save_impl(root, step, params, &optimizer, state, options);
}

std::optional<std::string> latest_step_dir(const std::string& root) {
  if (path_exists((fs::path(root) / "index.json").string())) return root;
  const std::string latest = (fs::path(root) / "latest").string();
  if (!path_exists(latest)) return std::nullopt;
  return (fs::path(root) / parse_latest(read_file(latest, kMaxLatestBytes), latest)).string();
}

namespace {

// Every tensor the index lists is in its file with that dtype and shape, and each file
// holds nothing else.
void check_index_matches(const Index& index, const std::string& index_path, const SafetensorsFile& file,
                         const std::string& file_name) {
  size_t listed = 0;
  for (const IndexedTensor& t : index.tensors) {
    if (t.file != file_name) continue;
    ++listed;
    const SafetensorsEntry* e = file.find(t.name);
    if (e == nullptr) throw InputError(cat(index_path, ": tensor ", printable(t.name), " is not in ", file.path()));
    if (e->dtype != t.dtype || e->shape != t.shape)
      throw InputError(cat(index_path, ": tensor ", printable(t.name), " is ", safetensors_dtype_name(t.dtype), " ",
                           shape_str(t.shape), ", but ", file.path(), " holds ", safetensors_dtype_name(e->dtype), " ",
                           shape_str(e->shape)));
  }
  if (listed != file.entries().size())
    throw InputError(cat(index_path, ": lists ", listed, " tensors in ", file_name, ", which holds ", file.entries().size()));
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(cat(path, ": no such checkpoint"));
  if (!fs::is_directory(path, ec)) {
    c.path_ = path;
    c.model_ = SafetensorsFile::open(path);
    return c;
  }
  auto dir = latest_step_dir(path);
  if (!dir && fs::is_directory(fs::path(path) / "checkpoints", ec))  // a run directory
    dir = latest_step_dir((fs::path(path) / "checkpoints").string());
  if (!dir) throw InputError(cat(path, ": not a checkpoint (no index.json, latest or checkpoints/)"));
  c.path_ = *dir;
  const std::string index_path = (fs::path(*dir) / "index.json").string();
  const Index index =
      parse_index(parse_json_bounded(read_file(index_path, kIndexJsonLimits.max_bytes), index_path, kIndexJsonLimits),
                  index_path);
  // Each file is read once, no more bytes than the index says: its size and hash are
  // verified, then the same bytes are parsed.
  for (const auto& [name, entry] : index.files) {
    const std::string file = (fs::path(*dir) / name).string();
    std::string bytes = read_file(file, static_cast<size_t>(entry.bytes));
    if (static_cast<int64_t>(bytes.size()) != entry.bytes || sha256_hex(bytes) != entry.sha256)
      throw InputError(cat(file, ": ", bytes.size() != static_cast<size_t>(entry.bytes)
                                           ? cat(bytes.size(), " bytes, index.json says ", entry.bytes)
                                           : std::string("SHA-256 mismatch with index.json"),
                           ": the checkpoint is corrupt"));
    if (name == kModelFile) {
      c.model_ = SafetensorsFile::parse(file, std::move(bytes));
      check_index_matches(index, index_path, *c.model_, name);
    } else if (name == kOptimizerFile) {
      c.optimizer_ = SafetensorsFile::parse(file, std::move(bytes));
      check_index_matches(index, index_path, *c.optimizer_, name);
    } else {
      c.state_ = parse_state(parse_json_bounded(bytes, file, kStateJsonLimits), file);
    }
  }
  // A step directory's name and its state agree.
  const std::string dir_name = fs::path(*dir).filename().string();
  if (dir_name.starts_with("step_") && dir_name != cat("step_", c.state_->step))
    throw InputError(cat((fs::path(*dir) / "state.json").string(), ": step = ", c.state_->step, ", but the directory is ",
                         dir_name));
  if (c.optimizer_.has_value() != c.state_->has_optimizer_steps)
    throw InputError(cat((fs::path(*dir) / "state.json").string(), ": optimizer_steps ",
                         c.optimizer_ ? "missing, but the checkpoint holds optimizer state"
                                      : "given, but the checkpoint holds no optimizer state"));
  return c;
}

namespace {
// Finds `name` in f, accepting Hugging Face files that omit the "transformer." prefix.
const SafetensorsEntry* find_param(const SafetensorsFile& f, const std::string& name) {
  if (const auto* e = f.find(name)) return e;
  const std::string prefix = "transformer.";
  if (name.starts_with(prefix)) return f.find(name.substr(prefix.size()));
  return nullptr;
}

void copy_checked(const SafetensorsFile& f, const SafetensorsEntry* e, const std::string& name,
                  const Tensor& dst) {
  if (e == nullptr) throw InputError(cat(f.path(), ": no tensor ", name, " (the model expects it)"));
  if (e->shape != dst.shape())
    throw InputError(cat(f.path(), ": tensor ", name, " has shape ", shape_str(e->shape),
                         ", the model expects ", shape_str(dst.shape()), " (a different model shape?)"));
  f.read_into(*e, dst);
}

// The tensor for parameter `p` (or its optimizer buffer `name`) into dst: the whole of it,
// or for a tensor-parallel piece the logical tensor's piece.
void load_param(const SafetensorsFile& f, const SafetensorsEntry* e, const std::string& name, const ParamInfo& p,
                const Tensor& dst) {
  if (p.split.dim < 0) return copy_checked(f, e, name, dst);
  LOOM_CHECK(dst.dtype() == DType::kF32);
  Tensor whole = Tensor::zeros(p.global_shape, DType::kF32);
  copy_checked(f, e, name, whole);
  take_piece(p, whole.data<float>(), dst.data<float>());
}
}  // namespace

std::string Checkpoint::nonfinite_report() const {
  std::vector<std::pair<const SafetensorsFile*, std::pair<std::string, int64_t>>> found;
  for (const auto* f : {&*model_, optimizer_ ? &*optimizer_ : nullptr})
    if (f != nullptr)
      for (auto& t : f->nonfinite()) found.emplace_back(f, std::move(t));
  if (found.empty()) return "";
  const auto& [file, first] = found.front();
  return cat(file->path(), ": tensor ", printable(first.first), " holds ", first.second,
             " non-finite value(s) (NaN or Inf)",
             found.size() > 1 ? cat(", and ", found.size() - 1, " more tensor(s) do") : std::string());
}

void Checkpoint::load_params(const ParamSet& params) const {
  for (size_t i = 0; i < params.infos().size(); ++i) {
    const ParamInfo& p = params.infos()[i];
    load_param(*model_, find_param(*model_, p.name), p.name, p, params.value(static_cast<int>(i)));
  }
}

void Checkpoint::load_optimizer(const ParamSet& params, optim::Optimizer& optimizer) const {
  optim::FlatState flat{.buffers = optimizer.state()};  // views: loading fills the optimizer
  load_optimizer(params, flat);
  optimizer.set_steps(flat.steps);
}

void Checkpoint::load_optimizer(const ParamSet& params, optim::FlatState& state) const {
  LOOM_CHECK(has_state());
  if (!optimizer_) throw InputError(cat(path_, ": holds no optimizer state"));
  for (const auto& [role, flat] : state.buffers)
    for (const ParamInfo& p : params.infos()) {
      const std::string name = role + "." + p.name;
      load_param(*optimizer_, optimizer_->find(name), name, p, flat.slice_rows(p.offset, p.offset + p.numel).view(p.shape));
    }
  state.steps = state_->optimizer_steps;
}

}  // namespace loom::checkpoint
