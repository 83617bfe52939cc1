// A JSON helper the data readers share (manifests, tokenizer.json). Private to loom_data.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace loom::data {

// j[key] when it is a string, else "" (a field of another type is then refused as a wrong
// value, never a library exception).
inline std::string string_or_empty(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

}  // namespace loom::data
