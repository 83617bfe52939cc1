// Typed reads of the fields of a JSON object parsed from a file a user hands Loom
// (docs/formats.md): each read checks the field is there (or optional), of the right type
// and inside its range, and a violation is an InputError naming the file, the field's path
// and what was expected. Readers of checkpoint state, indexes and every later format take
// their values through it, so no library exception and no unchecked value gets past them.
// Thread-safety: a JsonFields is a view of one object; use it from one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace loom {

class JsonFields {
 public:
  // `object` must outlive this. InputError when it is not a JSON object. Messages name
  // `file`, then each field as prefix + key (e.g. prefix "tensors[3]." for an element).
  JsonFields(const nlohmann::json& object, std::string file, std::string prefix = "");

  bool has(const std::string& key) const;
  // Integers in [lo, hi]. A number with a fraction, a string of digits or a bool is not one.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const;
  std::optional<int64_t> optional_integer(const std::string& key, int64_t lo, int64_t hi) const;
  uint64_t unsigned_integer(const std::string& key) const;
  std::string string(const std::string& key, size_t max_length = 4096) const;
  std::optional<std::string> optional_string(const std::string& key, size_t max_length = 4096) const;
  std::optional<bool> optional_boolean(const std::string& key) const;
  // A nested object (its fields named "key.field") or an array.
  JsonFields object(const std::string& key) const;
  const nlohmann::json& array(const std::string& key) const;
  // A field whose value must be one string: InputError listing `expected` otherwise.
  void expect_string(const std::string& key, const std::string& expected) const;

  const nlohmann::json& value() const { return object_; }
  const std::string& file() const { return file_; }
  // "file: prefix.key", to start messages for checks the reads above cannot express.
  std::string field(const std::string& key) const;

 private:
  const nlohmann::json& get(const std::string& key) const;

  const nlohmann::json& object_;
  std::string file_, prefix_;
};

}  // namespace loom
