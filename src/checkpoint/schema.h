// The JSON files of a checkpoint directory, validated field by field before anything in
// them is used (docs/formats.md, "Checkpoints"): index.json's files and tensors, and
// state.json's step, counters, RNG and model shape; and the `latest` pointer. Every violation is an InputError
// naming the file and the field. Internal to loom_checkpoint.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/checkpoint.h"

namespace loom::checkpoint {

struct IndexedFile {
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct IndexedTensor {
  std::string name, file;
  DType dtype;
  Shape shape;
};

struct Index {
  std::map<std::string, IndexedFile> files;  // by plain file name
  std::vector<IndexedTensor> tensors;
};

Index parse_index(const nlohmann::json& index, const std::string& path);
State parse_state(const nlohmann::json& state, const std::string& path);

// `latest` holds one line: the name of a step directory, step_N.
constexpr size_t kMaxLatestBytes = 256;
// The directory name `text` (read from `path`) names, trailing newline and spaces dropped.
std::string parse_latest(std::string_view text, const std::string& path);

}  // namespace loom::checkpoint
