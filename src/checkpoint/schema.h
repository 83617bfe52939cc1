// The JSON files of a checkpoint directory, validated field by field before anything in
// them is used (docs/formats.md, "Checkpoints"): index.json's files and tensors, and
// state.json's step, counters, RNG and model shape; and the `latest` pointer. Every violation is an InputError
// naming the file and the field. Internal to loom_checkpoint.
#pragma once

#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/checkpoint/checkpoint.h"
#include "loom/checkpoint/tensor_pieces.h"

namespace loom::checkpoint {

struct IndexedFile {
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

// One block of a logical tensor, held whole by one tensor (`key`) of one file.
struct IndexedShard {
  std::string file, key;
  Box box;
  std::string sha256;  // of the tensor's bytes in the file; "" in format version 1
};

struct IndexedTensor {
  std::string name;
  Part part = Part::kModel;
  DType dtype;
  Shape shape;
  std::vector<IndexedShard> shards;  // their extents sum to the shape's size
};

struct Index {
  int version = kFormatVersion;
  std::map<std::string, IndexedFile> files;  // by plain file name
  std::vector<IndexedTensor> tensors;
  nlohmann::json layout;  // version 2: the layout that wrote it (informational)
};

// Validates every field and the geometry each tensor's shards can be checked for without
// allocating: within the shape, extents summing to its size, files listed and of the
// tensor's part, no tensor of a file named twice.
Index parse_index(const nlohmann::json& index, const std::string& path);
// No two shards of `t` overlap, so (with parse_index's sum) they tile it. Memory: one bit
// per element of t when it has many shards; call it once the files' sizes are known to be
// real (they bound every tensor's size).
void check_tiling(const IndexedTensor& t, const std::string& path);
// Whether `name` may be a file of a checkpoint of this format version, and of which part.
std::optional<Part> shard_file_part(const std::string& name, int version);
// One of kExtraFiles (version 2 and later).
bool is_extra_file(const std::string& name, int version);
State parse_state(const nlohmann::json& state, const std::string& path);

// `latest` holds one line: the name of a step directory, step_N.
constexpr size_t kMaxLatestBytes = 256;
// The directory name `text` (read from `path`) names, trailing newline and spaces dropped.
std::string parse_latest(std::string_view text, const std::string& path);

}  // namespace loom::checkpoint
