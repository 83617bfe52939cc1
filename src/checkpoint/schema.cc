#include "schema.h"

#include <algorithm>
#include <set>

#include "loom/core/error.h"
#include "loom/checkpoint/json_fields.h"

namespace loom::checkpoint {
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;  // as safetensors.cc: no real tensor is near
constexpr int64_t kMaxShapeField = INT32_MAX;  // model.n_layer, d_model, ...

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

Shape shape_of(const json& dims, const std::string& what) {
  if (!dims.is_array() || dims.size() > 8) throw InputError(cat(what, ": expected an array of at most 8 dimensions"));
  Shape s;
  for (const json& d : dims) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
      throw InputError(cat(what, " = ", printable(dims.dump().substr(0, 80)), ": expected integers in [0, ", kMaxDim, "]"));
    s.push_back(d.get<int64_t>());
  }
  return s;
}

// The model's shape: its kind and exactly that kind's fields, each a positive integer. Whether
// they make a model (e.g. d_model divisible by n_head) is for whoever builds it to say.
void check_model(const JsonFields& m) {
  const std::string kind = m.string("kind", 16);
  std::vector<std::string> keys;
  if (kind == "gpt") keys = {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"};
  else if (kind == "mlp") keys = {"inputs", "hidden", "n_hidden", "classes"};
  else throw InputError(cat(m.field("kind"), " = \"", printable(kind), "\": expected \"gpt\" or \"mlp\""));
  for (const std::string& k : keys) m.integer(k, 1, kMaxShapeField);
  for (auto it = m.value().begin(); it != m.value().end(); ++it)
    if (it.key() != "kind" && std::find(keys.begin(), keys.end(), it.key()) == keys.end())
      throw InputError(cat(m.field(it.key()), ": not a field of a ", kind, " model"));
}

}  // namespace

bool is_extra_file(const std::string& name, int version) {
  return version >= 2 && std::find_if(std::begin(kExtraFiles), std::end(kExtraFiles),
                                      [&](const char* f) { return name == f; }) != std::end(kExtraFiles);
}

std::optional<Part> shard_file_part(const std::string& name, int version) {
  if (version == 1) {
    if (name == "model.safetensors") return Part::kModel;
    if (name == "optimizer.safetensors") return Part::kOptimizer;
    return std::nullopt;
  }
  // model-<rank>.safetensors, optimizer-<rank>.safetensors: 1 to 9 digits.
  for (const auto& [prefix, part] : {std::pair{"model-", Part::kModel}, std::pair{"optimizer-", Part::kOptimizer}}) {
    const std::string p = prefix, suffix = ".safetensors";
    if (!name.starts_with(p) || !name.ends_with(suffix)) continue;
    const std::string digits = name.substr(p.size(), name.size() - p.size() - suffix.size());
    if (!digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos) return part;
  }
  return std::nullopt;
}

namespace {

constexpr int64_t kMaxNumel = int64_t{1} << 50;
constexpr size_t kMaxShards = size_t{1} << 20;  // of one tensor

// The number of elements of `s`, or -1 past kMaxNumel.
int64_t numel_capped(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d != 0 && n > kMaxNumel / d) return -1;
    n *= d;
  }
  return n;
}

// Version 2: {"file", "key", "offsets", "extents", "sha256"}; version 1: the whole tensor, keyed by its name.
IndexedShard parse_shard(const JsonFields& s, const IndexedTensor& t, int version, const Index& index) {
  IndexedShard e{.file = s.string("file", 255)};
  const std::optional<Part> part = shard_file_part(e.file, version);
  if (!part)
    throw InputError(cat(s.field("file"), " = \"", printable(e.file), "\": expected ",
                         version == 1 ? "model.safetensors or optimizer.safetensors"
                                      : "model-<rank>.safetensors or optimizer-<rank>.safetensors"));
  if (!index.files.contains(e.file)) throw InputError(cat(s.field("file"), " = \"", e.file, "\": not listed under files"));
  if (version >= 2 && *part != t.part)
    throw InputError(cat(s.field("file"), " = \"", e.file, "\": a ", *part == Part::kModel ? "model" : "optimizer",
                         " file, but the tensor is part \"", t.part == Part::kModel ? "model" : "optimizer", "\""));
  e.box.offsets = shape_of(s.array("offsets"), s.field("offsets"));
  e.box.extents = shape_of(s.array("extents"), s.field("extents"));
  if (version == 1) {
    if (e.box.offsets != Shape(t.shape.size(), 0) || e.box.extents != t.shape)
      throw InputError(cat(s.field("offsets"), ": expected offsets all 0 and extents equal to the shape (format version 1)"));
    e.key = t.name;
    return e;
  }
  if (e.box.offsets.size() != t.shape.size() || e.box.extents.size() != t.shape.size())
    throw InputError(cat(s.field("extents"), ": expected ", t.shape.size(), " dimensions, as the tensor's shape"));
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (e.box.extents[d] < 1 || e.box.offsets[d] + e.box.extents[d] > t.shape[d])
      throw InputError(cat(s.field("extents"), " = ", shape_str(e.box.extents), " at offsets ", shape_str(e.box.offsets),
                           ": not a non-empty block of the shape ", shape_str(t.shape)));
  e.key = s.string("key", 2048);
  if (e.key.empty()) throw InputError(cat(s.field("key"), ": expected the tensor's name in its file"));
  e.sha256 = s.string("sha256", 64);
  if (!is_sha256_hex(e.sha256))
    throw InputError(cat(s.field("sha256"), " = \"", printable(e.sha256), "\": expected 64 lowercase hex digits"));
  return e;
}

}  // namespace

Index parse_index(const json& j, const std::string& path) {
  const JsonFields top(j, path);
  top.expect_string("format", "loom-checkpoint-index");
  Index index;
  index.version = static_cast<int>(top.integer("version", 1, kFormatVersion));
  const JsonFields files = top.object("files");
  for (auto it = files.value().begin(); it != files.value().end(); ++it) {
    const std::string& name = it.key();
    if (name != "state.json" && !shard_file_part(name, index.version) && !is_extra_file(name, index.version))
      throw InputError(cat(files.field(name), ": unknown file; expected state.json and ",
                           index.version == 1 ? "model.safetensors and optimizer.safetensors"
                                              : "model-<rank>.safetensors and optimizer-<rank>.safetensors files "
                                                "(and tokenizer/encoder.json, tokenizer/vocab.bpe)"));
    const JsonFields f = files.object(name);
    IndexedFile entry{.bytes = f.integer("bytes", 0, int64_t{1} << 50), .sha256 = f.string("sha256", 64)};
    if (!is_sha256_hex(entry.sha256))
      throw InputError(cat(f.field("sha256"), " = \"", printable(entry.sha256), "\": expected 64 lowercase hex digits"));
    index.files[name] = entry;
  }
  if (!index.files.contains("state.json")) throw InputError(cat(files.field("state.json"), ": missing"));
  if (index.version == 1 && !index.files.contains("model.safetensors"))
    throw InputError(cat(files.field("model.safetensors"), ": missing"));
  if (index.version >= 2 && top.has("layout")) index.layout = top.object("layout").value();
  const json& tensors = top.array("tensors");
  std::set<std::string> names;
  std::set<std::pair<std::string, std::string>> keys;  // (file, key)
  for (size_t i = 0; i < tensors.size(); ++i) {
    const JsonFields t(tensors[i], path, cat("tensors[", i, "]."));
    IndexedTensor e{.name = t.string("name", 1024)};
    if (!names.insert(e.name).second) throw InputError(cat(t.field("name"), " = \"", printable(e.name), "\": listed twice"));
    const std::string dtype = t.string("dtype", 16);
    const auto dt = dtype_from_safetensors(dtype);
    if (!dt) throw InputError(cat(t.field("dtype"), " = \"", printable(dtype), "\": not a safetensors dtype Loom reads"));
    e.dtype = *dt;
    e.shape = shape_of(t.array("shape"), t.field("shape"));
    const int64_t numel = numel_capped(e.shape);
    if (numel < 0) throw InputError(cat(t.field("shape"), " = ", shape_str(e.shape), ": over 2^50 elements"));
    if (index.version >= 2) {
      const std::string part = t.string("part", 16);
      if (part != "model" && part != "optimizer")
        throw InputError(cat(t.field("part"), " = \"", printable(part), "\": expected \"model\" or \"optimizer\""));
      e.part = part == "model" ? Part::kModel : Part::kOptimizer;
    }
    const json& shards = t.array("shards");
    if (index.version == 1 ? shards.size() != 1 : (shards.size() > kMaxShards || (shards.empty() && numel > 0)))
      throw InputError(cat(t.field("shards"), ": ", shards.size(), " shards; expected ",
                           index.version == 1 ? std::string("exactly one (format version 1)")
                                              : cat("1 to ", kMaxShards)));
    int64_t covered = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
      IndexedShard s = parse_shard(JsonFields(shards[k], path, cat("tensors[", i, "].shards[", k, "].")), e,
                                   index.version, index);
      if (index.version == 1) e.part = *shard_file_part(s.file, 1);
      if (!keys.insert({s.file, s.key}).second)
        throw InputError(cat(t.field("shards"), ": tensor \"", printable(s.key), "\" of ", s.file, " is named twice"));
      covered += s.box.numel();  // each at most numel: no overflow
      e.shards.push_back(std::move(s));
    }
    if (covered != numel)
      throw InputError(cat(t.field("shards"), ": the shards hold ", covered, " elements of a tensor of ", numel));
    index.tensors.push_back(std::move(e));
  }
  return index;
}

void check_tiling(const IndexedTensor& t, const std::string& path) {
  const auto& s = t.shards;
  auto overlap = [&](size_t a, size_t b) {
    return InputError(cat(path, ": tensor ", printable(t.name), ": shards ", a, " and ", b, " overlap (",
                          shape_str(s[a].box.offsets), " + ", shape_str(s[a].box.extents), " and ",
                          shape_str(s[b].box.offsets), " + ", shape_str(s[b].box.extents), ")"));
  };
  if (s.size() <= 64) {
    for (size_t a = 0; a < s.size(); ++a)
      for (size_t b = a + 1; b < s.size(); ++b)
        if (!empty(intersect(s[a].box, s[b].box))) throw overlap(a, b);
    return;
  }
  // One bit per element; each shard's last-dimension runs marked in turn.
  const int64_t numel = numel_capped(t.shape);
  std::vector<bool> seen(static_cast<size_t>(numel), false);
  const size_t rank = t.shape.size();
  for (size_t k = 0; k < s.size(); ++k) {
    const Box& b = s[k].box;
    const int64_t run = rank == 0 ? 1 : b.extents[rank - 1];
    Shape at(rank, 0);  // the position within b; the last dimension stays 0
    while (true) {
      int64_t flat = 0;
      for (size_t d = 0; d < rank; ++d) flat = flat * t.shape[d] + b.offsets[d] + at[d];
      for (int64_t e = 0; e < run; ++e) {
        if (seen[static_cast<size_t>(flat + e)])
          for (size_t a = 0; a < k; ++a)
            if (!empty(intersect(s[a].box, b))) throw overlap(a, k);
        seen[static_cast<size_t>(flat + e)] = true;
      }
      if (rank <= 1) break;
      size_t d = rank - 1;
      while (d-- > 0) {
        if (++at[d] < b.extents[d]) break;
        at[d] = 0;
      }
      if (d == static_cast<size_t>(-1)) break;
    }
  }
}

State parse_state(const json& j, const std::string& path) {
  const JsonFields top(j, path);
  top.expect_string("format", "loom-checkpoint");
  top.integer("version", 1, kFormatVersion);
  State s{.raw = j};
  s.step = top.integer("step", 0, int64_t{1} << 53);
  s.optimizer_steps = top.optional_integer("optimizer_steps", 0, s.step).value_or(0);
  s.has_optimizer_steps = top.has("optimizer_steps");
  s.data_cursor = top.optional_integer("data_cursor", 0, INT64_MAX);
  if (top.has("rng")) {
    const JsonFields rng = top.object("rng");
    if (rng.has("seed")) s.seed = rng.unsigned_integer("seed");
  }
  if (top.has("model")) {
    check_model(top.object("model"));
    s.model = j["model"];
  }
  s.finite = top.optional_boolean("finite").value_or(true);
  top.optional_string("config", size_t{1} << 20);
  return s;
}

std::string parse_latest(std::string_view text, const std::string& path) {
  std::string name(text);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.size() < 6 || name.size() > 24 || !name.starts_with("step_") ||
      name.find_first_not_of("0123456789", 5) != std::string::npos)
    throw InputError(cat(path, ": \"", printable(name.substr(0, 40)), "\": expected the name of a step directory, step_N"));
  return name;
}

}  // namespace loom::checkpoint
