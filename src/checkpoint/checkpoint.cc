// Reading a checkpoint (docs/formats.md, "Checkpoint directories"): the index and state up
// front, shard files when a load first needs them, each verified before use, and the
// blocks of every logical tensor put together into whatever piece the caller holds.
#include "loom/checkpoint/checkpoint.h"

#include <filesystem>
#include <set>

#include "loom/checkpoint/bounded_json.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "schema.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::optional<std::string> latest_step_dir(const std::string& root) {
  if (path_exists((fs::path(root) / "index.json").string())) return root;
  const std::string latest = (fs::path(root) / "latest").string();
  if (!path_exists(latest)) return std::nullopt;
  return (fs::path(root) / parse_latest(read_file(latest, kMaxLatestBytes), latest)).string();
}

struct Checkpoint::Impl {
  Index index;              // a bare file: version 0, the file listed under its own path
  std::string dir;          // "" for a bare file
  std::string index_path;   // what errors about the index name
  std::map<std::string, size_t> by_name;
  mutable std::map<std::string, SafetensorsFile> opened;
  // Per opened file, its tensors holding NaN or Inf: each file is scanned once.
  mutable std::map<std::string, std::vector<std::pair<std::string, int64_t>>> nonfinite;

  std::string file_path(const std::string& file) const { return dir.empty() ? file : (fs::path(dir) / file).string(); }

  const IndexedTensor* find(const std::string& name) const {
    auto it = by_name.find(name);
    // Hugging Face's own files omit the "transformer." prefix.
    if (it == by_name.end() && name.starts_with("transformer.")) it = by_name.find(name.substr(12));
    return it == by_name.end() ? nullptr : &index.tensors[it->second];
  }

  // Reads `file` no further than the index says, verifies its size and hash, parses it and
  // checks its tensors against the index.
  const SafetensorsFile& open_file(const std::string& file) const {
    if (auto it = opened.find(file); it != opened.end()) return it->second;
    const IndexedFile& entry = index.files.at(file);
    const std::string path = file_path(file);
    FileBytes bytes = read_file_bytes(path, static_cast<size_t>(entry.bytes));
    if (static_cast<int64_t>(bytes.size()) != entry.bytes)
      throw InputError(cat(path, ": ", bytes.size(), " bytes, index.json says ", entry.bytes, ": the checkpoint is corrupt"));
    if (sha256_hex(bytes.view()) != entry.sha256)
      throw InputError(cat(path, ": SHA-256 mismatch with index.json", which_differs(file, std::move(bytes)),
                           ": the checkpoint is corrupt"));
    SafetensorsFile f = SafetensorsFile::parse(path, std::move(bytes));
    check_file(f, file);
    return opened.emplace(file, std::move(f)).first->second;
  }

  // For a file whose hash is wrong: which tensor's bytes differ from the index's record.
  std::string which_differs(const std::string& file, FileBytes bytes) const {
    try {
      const SafetensorsFile f = SafetensorsFile::parse(file_path(file), std::move(bytes));
      for (const IndexedTensor& t : index.tensors)
        for (const IndexedShard& s : t.shards) {
          if (s.file != file || s.sha256.empty()) continue;
          const SafetensorsEntry* e = f.find(s.key);
          if (e == nullptr) return cat(" (its header no longer lists tensor ", printable(s.key), ")");
          if (sha256_hex(f.bytes_of(*e)) != s.sha256) return cat(" in tensor ", printable(s.key));
        }
      return " (in its header)";
    } catch (const InputError&) {
      return " (its header no longer parses)";
    }
  }

  // Every shard the index places in `file` is there with its dtype and shape, and the file
  // holds nothing else.
  void check_file(const SafetensorsFile& f, const std::string& file) const {
    size_t listed = 0;
    for (const IndexedTensor& t : index.tensors)
      for (const IndexedShard& s : t.shards) {
        if (s.file != file) continue;
        ++listed;
        const SafetensorsEntry* e = f.find(s.key);
        if (e == nullptr) throw InputError(cat(index_path, ": tensor ", printable(s.key), " is not in ", f.path()));
        if (e->dtype != t.dtype || e->shape != s.box.extents)
          throw InputError(cat(index_path, ": tensor ", printable(s.key), " is ", safetensors_dtype_name(t.dtype), " ",
                               shape_str(s.box.extents), ", but ", f.path(), " holds ", safetensors_dtype_name(e->dtype),
                               " ", shape_str(e->shape)));
      }
    if (listed != f.entries().size())
      throw InputError(cat(index_path, ": lists ", listed, " tensors in ", file, ", which holds ", f.entries().size()));
  }

  // The shards of t that hold part of the box `local` of p (this process's piece of t).
  std::vector<const IndexedShard*> needed(const IndexedTensor& t, const ParamInfo& p, const Box& local) const {
    std::vector<const IndexedShard*> out;
    const auto boxes = logical_boxes(p, local);
    for (const IndexedShard& s : t.shards)
      for (const auto& [logical, part] : boxes)
        if (!empty(intersect(logical, s.box))) {
          out.push_back(&s);
          break;
        }
    return out;
  }

  const IndexedTensor& tensor_for(const std::string& name, const ParamInfo& p) const {
    const IndexedTensor* t = find(name);
    const std::string where = dir.empty() ? index.files.begin()->first : index_path;
    if (t == nullptr) throw InputError(cat(where, ": no tensor ", name, " (the model expects it)"));
    if (t->shape != p.global_shape)
      throw InputError(cat(where, ": tensor ", name, " has shape ", shape_str(t->shape), ", the model expects ",
                           shape_str(p.global_shape), " (a different model shape?)"));
    return *t;
  }

  // each(fn) calls fn(tensor, param, box of the param's piece, destination) for everything a
  // load fills: every file their shards hold is opened (and verified) before anything is
  // copied.
  template <typename Each>
  void load_all(Each each) const {
    std::set<std::string> files;
    each([&](const IndexedTensor& t, const ParamInfo& p, const Box& local, const Tensor&) {
      for (const IndexedShard* s : needed(t, p, local)) files.insert(s->file);
    });
    for (const std::string& f : files) open_file(f);
    each([&](const IndexedTensor& t, const ParamInfo& p, const Box& local, const Tensor& dst) {
      populate_for_write(dst.raw(), dst.nbytes());  // written whole next: no page faults one by one
      fill(t, p, local, dst);
    });
  }

  // dst (the box `local` of p's piece of t: contiguous, shape local.extents) from t's
  // shards, converting dtype.
  void fill(const IndexedTensor& t, const ParamInfo& p, const Box& local, const Tensor& dst) const {
    LOOM_CHECK(dst.is_contiguous() && dst.shape() == local.extents);
    const Box whole{.offsets = Shape(p.shape.size(), 0), .extents = p.shape};
    const size_t es = dtype_size(dst.dtype());
    for (const IndexedShard* s : needed(t, p, local)) {
      const SafetensorsFile& f = open_file(s->file);
      const SafetensorsEntry& e = *f.find(s->key);
      if (p.split.dim < 0 && s->box == whole && local == whole) {  // the common case: one shard, the whole tensor
        f.read_into(e, dst);
        continue;
      }
      // The shard's elements in dst's dtype: its bytes in the file when they are already.
      Tensor converted;
      const void* src = f.bytes_of(e).data();
      if (e.dtype != dst.dtype()) {
        converted = Tensor::zeros(s->box.extents, dst.dtype());
        f.read_into(e, converted);
        src = converted.raw();
      }
      for (const auto& [logical, part] : logical_boxes(p, local)) {
        const Box in = intersect(logical, s->box);
        if (empty(in)) continue;
        Shape src_at(in.offsets.size()), dst_at(in.offsets.size());
        for (size_t d = 0; d < in.offsets.size(); ++d) {
          src_at[d] = in.offsets[d] - s->box.offsets[d];
          dst_at[d] = part.offsets[d] + in.offsets[d] - logical.offsets[d] - local.offsets[d];
        }
        copy_box(src, s->box.extents, src_at, dst.raw(), local.extents, dst_at, in.extents, es);
      }
    }
  }
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  Impl& m = *c.impl_;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(cat(path, ": no such checkpoint"));
  if (!fs::is_directory(path, ec)) {  // a bare .safetensors file: weights only
    c.path_ = path;
    SafetensorsFile f = SafetensorsFile::open(path);
    m.index.version = 0;
    m.index.files[path] = {.bytes = static_cast<int64_t>(fs::file_size(path, ec))};
    for (const SafetensorsEntry& e : f.entries()) {
      m.by_name[e.name] = m.index.tensors.size();
      m.index.tensors.push_back({.name = e.name, .part = Part::kModel, .dtype = e.dtype, .shape = e.shape,
                                 .shards = {{.file = path, .key = e.name,
                                             .box = {.offsets = Shape(e.shape.size(), 0), .extents = e.shape}}}});
    }
    m.opened.emplace(path, std::move(f));
    return c;
  }
  auto dir = latest_step_dir(path);
  if (!dir && fs::is_directory(fs::path(path) / "checkpoints", ec))  // a run directory
    dir = latest_step_dir((fs::path(path) / "checkpoints").string());
  if (!dir) throw InputError(cat(path, ": not a checkpoint (no index.json, latest or checkpoints/)"));
  c.path_ = m.dir = *dir;
  m.index_path = (fs::path(*dir) / "index.json").string();
  // Version 2 records the index's own hash beside it: no byte of it changes unseen.
  const std::string index_text = read_file(m.index_path, kIndexJsonLimits.max_bytes);
  const std::string hash_path = (fs::path(*dir) / "index.sha256").string();
  const bool hashed = path_exists(hash_path);
  if (hashed) {
    std::string want = read_file(hash_path, 128);
    while (!want.empty() && (want.back() == '\n' || want.back() == ' ')) want.pop_back();
    if (want.size() != 64 || want.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw InputError(cat(hash_path, ": expected the 64 hex digits of index.json's SHA-256"));
    if (sha256_hex(index_text) != want)
      throw InputError(cat(m.index_path, ": SHA-256 mismatch with index.sha256: the checkpoint is corrupt"));
  }
  m.index = parse_index(parse_json_bounded(index_text, m.index_path, kIndexJsonLimits), m.index_path);
  if (!hashed && m.index.version >= 2)
    throw InputError(cat(hash_path, ": missing; a version ", m.index.version, " checkpoint records index.json's hash there"));
  // Every file is the size the index says (so the sizes below are real), its tensors fit
  // in it, and each tensor's shards tile it.
  std::map<std::string, int64_t> needs;
  for (const IndexedTensor& t : m.index.tensors)
    for (const IndexedShard& s : t.shards) needs[s.file] += s.box.numel() * static_cast<int64_t>(dtype_size(t.dtype));
  for (const auto& [name, entry] : m.index.files) {
    const std::string file = m.file_path(name);
    const auto size = fs::file_size(file, ec);
    if (ec) throw InputError(cat(file, ": cannot read (", ec.message(), "); index.json lists it: the checkpoint is incomplete"));
    if (static_cast<int64_t>(size) != entry.bytes)
      throw InputError(cat(file, ": ", size, " bytes, index.json says ", entry.bytes, ": the checkpoint is corrupt"));
    if (needs[name] > entry.bytes)
      throw InputError(cat(m.index_path, ": the tensors it places in ", name, " need ", needs[name], " bytes, but the file has ",
                           entry.bytes));
  }
  for (size_t i = 0; i < m.index.tensors.size(); ++i) {
    check_tiling(m.index.tensors[i], m.index_path);
    m.by_name[m.index.tensors[i].name] = i;
  }
  const std::string state_path = (fs::path(*dir) / "state.json").string();
  const IndexedFile& st = m.index.files.at("state.json");
  const std::string bytes = read_file(state_path, static_cast<size_t>(st.bytes));
  if (sha256_hex(bytes) != st.sha256)
    throw InputError(cat(state_path, ": SHA-256 mismatch with index.json: the checkpoint is corrupt"));
  c.state_ = parse_state(parse_json_bounded(bytes, state_path, kStateJsonLimits), state_path);
  // A step directory's name and its state agree.
  const std::string dir_name = fs::path(*dir).filename().string();
  if (dir_name.starts_with("step_") && dir_name != cat("step_", c.state_->step))
    throw InputError(cat(state_path, ": step = ", c.state_->step, ", but the directory is ", dir_name));
  bool optimizer = false;
  for (const IndexedTensor& t : m.index.tensors) optimizer = optimizer || t.part == Part::kOptimizer;
  if (optimizer && !c.state_->has_optimizer_steps)
    throw InputError(cat(state_path, ": optimizer_steps missing, but the checkpoint holds optimizer state"));
  if (m.index.version == 1 && !optimizer && c.state_->has_optimizer_steps && !m.index.files.contains("optimizer.safetensors"))
    throw InputError(cat(state_path, ": optimizer_steps given, but the checkpoint holds no optimizer state"));
  return c;
}

int Checkpoint::format_version() const { return impl_->index.version; }
const json& Checkpoint::layout() const { return impl_->index.layout; }

std::vector<TensorInfo> Checkpoint::tensors() const {
  std::vector<TensorInfo> out;
  for (const IndexedTensor& t : impl_->index.tensors) out.push_back({t.name, t.part, t.dtype, t.shape});
  return out;
}

std::optional<TensorInfo> Checkpoint::find(const std::string& name) const {
  const IndexedTensor* t = impl_->find(name);
  if (t == nullptr) return std::nullopt;
  return TensorInfo{t->name, t->part, t->dtype, t->shape};
}

std::map<std::string, int64_t> Checkpoint::files() const {
  std::map<std::string, int64_t> out;
  for (const auto& [name, f] : impl_->index.files) out[name] = f.bytes;
  return out;
}

std::string Checkpoint::nonfinite_report() const {
  std::vector<std::pair<const SafetensorsFile*, std::pair<std::string, int64_t>>> found;
  for (const auto& [name, f] : impl_->opened) {
    auto it = impl_->nonfinite.find(name);
    if (it == impl_->nonfinite.end()) it = impl_->nonfinite.emplace(name, f.nonfinite()).first;
    for (const auto& t : it->second) found.emplace_back(&f, t);
  }
  if (found.empty()) return "";
  const auto& [file, first] = found.front();
  return cat(file->path(), ": tensor ", printable(first.first), " holds ", first.second,
             " non-finite value(s) (NaN or Inf)",
             found.size() > 1 ? cat(", and ", found.size() - 1, " more tensor(s) do") : std::string());
}

void Checkpoint::load_params(const ParamSet& params) const {
  const Impl& m = *impl_;
  m.load_all([&](auto&& fn) {
    for (size_t i = 0; i < params.infos().size(); ++i) {
      const ParamInfo& p = params.infos()[i];
      fn(m.tensor_for(p.name, p), p, Box{.offsets = Shape(p.shape.size(), 0), .extents = p.shape},
         params.value(static_cast<int>(i)));
    }
  });
}

void Checkpoint::load_optimizer(const ParamSet& params, optim::Optimizer& optimizer) const {
  optim::RangeState state{.ranges = {{0, params.numel()}}};  // views: loading fills the optimizer
  for (auto& [role, t] : optimizer.state()) state.buffers.push_back({role, {t}});
  load_optimizer(params, state);
  optimizer.set_steps(state.steps);
}

void Checkpoint::load_optimizer(const ParamSet& params, optim::RangeState& state) const {
  LOOM_CHECK(has_state());
  const Impl& m = *impl_;
  bool any = false;
  for (const IndexedTensor& t : m.index.tensors) any = any || t.part == Part::kOptimizer;
  if (!any && !state.buffers.empty()) throw InputError(cat(path_, ": holds no optimizer state"));
  // Each range, parameter by parameter, as boxes of the parameter's piece that are
  // contiguous in the range's tensor.
  m.load_all([&](auto&& fn) {
    for (const auto& [role, views] : state.buffers) {
      LOOM_CHECK_EQ(views.size(), state.ranges.size());
      for (size_t r = 0; r < views.size(); ++r) {
        const auto [lo, hi] = state.ranges[r];
        LOOM_CHECK(views[r].is_contiguous() && views[r].numel() == hi - lo);
        const Tensor flat = views[r].view({hi - lo});
        for (const ParamInfo& p : params.infos()) {
          const int64_t begin = std::max(lo, p.offset), end = std::min(hi, p.offset + p.numel);
          if (begin >= end) continue;
          int64_t at = begin - lo;
          for (const Box& b : range_boxes(p.shape, begin - p.offset, end - p.offset)) {
            fn(m.tensor_for(role + "." + p.name, p), p, b, flat.slice_rows(at, at + b.numel()).view(b.extents));
            at += b.numel();
          }
        }
      }
    }
  });
  state.steps = state_->optimizer_steps;
}

Tensor Checkpoint::read(const std::string& name, DType dtype) const {
  const IndexedTensor* t = impl_->find(name);
  LOOM_CHECK(t != nullptr);
  const ParamInfo whole{.name = name, .shape = t->shape, .kind = ParamKind::kWeight, .offset = 0,
                        .numel = shape_numel(t->shape), .global_shape = t->shape};
  Tensor out = Tensor::zeros(t->shape, dtype);
  impl_->fill(*t, whole, Box{.offsets = Shape(t->shape.size(), 0), .extents = t->shape}, out);
  return out;
}

int64_t Checkpoint::bytes_read() const {
  int64_t bytes = 0;
  for (const auto& [name, f] : impl_->opened) bytes += impl_->index.files.at(name).bytes;
  return bytes;
}

std::optional<std::string> Checkpoint::extra_file(const std::string& name) const {
  const auto it = impl_->index.files.find(name);
  if (it == impl_->index.files.end() || !is_extra_file(name, impl_->index.version)) return std::nullopt;
  const std::string path = impl_->file_path(name);
  std::string bytes = read_file(path, static_cast<size_t>(it->second.bytes));
  if (static_cast<int64_t>(bytes.size()) != it->second.bytes || sha256_hex(bytes) != it->second.sha256)
    throw InputError(cat(path, ": SHA-256 mismatch with index.json: the checkpoint is corrupt"));
  return bytes;
}

std::map<std::string, std::string> Checkpoint::extra_files() const {
  std::map<std::string, std::string> out;
  for (const char* name : kExtraFiles)
    if (auto bytes = extra_file(name)) out.emplace(name, std::move(*bytes));
  return out;
}

int64_t Checkpoint::verify_all() const {
  int64_t bytes = 0;
  for (const auto& [name, f] : impl_->index.files) {
    if (is_extra_file(name, impl_->index.version)) {
      extra_file(name);
    } else if (name != "state.json") {
      impl_->open_file(name);
    }
    bytes += f.bytes;
  }
  return bytes;
}

}  // namespace loom::checkpoint
