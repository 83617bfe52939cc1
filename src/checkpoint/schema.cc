#include "schema.h"

#include <algorithm>
#include <set>

#include "loom/error.h"
#include "loom/json_fields.h"

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

Index parse_index(const json& j, const std::string& path) {
  const JsonFields top(j, path);
  top.expect_string("format", "loom-checkpoint-index");
  top.integer("version", 1, kFormatVersion);
  Index index;
  const JsonFields files = top.object("files");
  for (auto it = files.value().begin(); it != files.value().end(); ++it) {
    const std::string& name = it.key();
    if (name != "model.safetensors" && name != "optimizer.safetensors" && name != "state.json")
      throw InputError(cat(files.field(name), ": unknown file; expected model.safetensors, optimizer.safetensors and "
                           "state.json"));
    const JsonFields f = files.object(name);
    IndexedFile entry{.bytes = f.integer("bytes", 0, int64_t{1} << 50), .sha256 = f.string("sha256", 64)};
    if (!is_sha256_hex(entry.sha256))
      throw InputError(cat(f.field("sha256"), " = \"", printable(entry.sha256), "\": expected 64 lowercase hex digits"));
    index.files[name] = entry;
  }
  for (const char* needed : {"model.safetensors", "state.json"})
    if (!index.files.contains(needed)) throw InputError(cat(files.field(needed), ": missing"));
  const json& tensors = top.array("tensors");
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const JsonFields t(tensors[i], path, cat("tensors[", i, "]."));
    IndexedTensor e{.name = t.string("name", 1024)};
    const std::string dtype = t.string("dtype", 16);
    const auto dt = dtype_from_safetensors(dtype);
    if (!dt) throw InputError(cat(t.field("dtype"), " = \"", printable(dtype), "\": not a safetensors dtype Loom reads"));
    e.dtype = *dt;
    e.shape = shape_of(t.array("shape"), t.field("shape"));
    // Version 1 holds each tensor whole in one file: one shard at offset 0 spanning the shape.
    const json& shards = t.array("shards");
    if (shards.size() != 1) throw InputError(cat(t.field("shards"), ": expected exactly one shard (format version 1)"));
    const JsonFields s(shards[0], path, cat("tensors[", i, "].shards[0]."));
    e.file = s.string("file", 255);
    if (e.file != "model.safetensors" && e.file != "optimizer.safetensors")
      throw InputError(cat(s.field("file"), " = \"", printable(e.file), "\": expected a .safetensors file of this index"));
    if (!index.files.contains(e.file)) throw InputError(cat(s.field("file"), " = \"", e.file, "\": not listed under files"));
    if (shape_of(s.array("offsets"), s.field("offsets")) != Shape(e.shape.size(), 0) ||
        shape_of(s.array("extents"), s.field("extents")) != e.shape)
      throw InputError(cat(t.field("shards"), ": expected offsets all 0 and extents equal to the shape (format version 1)"));
    if (!names.insert(e.name).second) throw InputError(cat(t.field("name"), " = \"", printable(e.name), "\": listed twice"));
    index.tensors.push_back(std::move(e));
  }
  return index;
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
