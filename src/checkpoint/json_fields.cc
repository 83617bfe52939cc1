#include "loom/checkpoint/json_fields.h"

#include "loom/core/error.h"

namespace loom {
using json = nlohmann::json;

JsonFields::JsonFields(const json& object, std::string file, std::string prefix)
    : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!object_.is_object())
    throw InputError(cat(file_, ": ", prefix_.empty() ? "" : prefix_.substr(0, prefix_.size() - 1) + ": ",
                         "expected a JSON object, found ", object_.type_name()));
}

std::string JsonFields::field(const std::string& key) const { return cat(file_, ": ", prefix_, printable(key)); }

bool JsonFields::has(const std::string& key) const { return object_.contains(key); }

const json& JsonFields::get(const std::string& key) const {
  auto it = object_.find(key);
  if (it == object_.end()) throw InputError(cat(field(key), ": missing"));
  return *it;
}

int64_t JsonFields::integer(const std::string& key, int64_t lo, int64_t hi) const {
  const json& v = get(key);
  // nlohmann keeps integers that fit int64 as number_integer, larger ones as unsigned.
  const bool fits = v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= INT64_MAX);
  if (!fits || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw InputError(cat(field(key), " = ", printable(v.dump()), ": expected an integer in [", lo, ", ", hi, "]"));
  return v.get<int64_t>();
}

std::optional<int64_t> JsonFields::optional_integer(const std::string& key, int64_t lo, int64_t hi) const {
  if (!has(key)) return std::nullopt;
  return integer(key, lo, hi);
}

uint64_t JsonFields::unsigned_integer(const std::string& key) const {
  const json& v = get(key);
  if (!v.is_number_unsigned())
    throw InputError(cat(field(key), " = ", printable(v.dump()), ": expected a non-negative integer"));
  return v.get<uint64_t>();
}

std::string JsonFields::string(const std::string& key, size_t max_length) const {
  const json& v = get(key);
  if (!v.is_string() || v.get_ref<const std::string&>().size() > max_length)
    throw InputError(cat(field(key), " = ", printable(v.dump().substr(0, 80)), ": expected a string of at most ",
                         max_length, " bytes"));
  return v.get<std::string>();
}

std::optional<std::string> JsonFields::optional_string(const std::string& key, size_t max_length) const {
  if (!has(key)) return std::nullopt;
  return string(key, max_length);
}

std::optional<bool> JsonFields::optional_boolean(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_boolean()) throw InputError(cat(field(key), " = ", printable(v.dump().substr(0, 80)), ": expected true or false"));
  return v.get<bool>();
}

JsonFields JsonFields::object(const std::string& key) const {
  const json& v = get(key);
  if (!v.is_object()) throw InputError(cat(field(key), ": expected an object, found ", v.type_name()));
  return JsonFields(v, file_, cat(prefix_, printable(key), "."));
}

const json& JsonFields::array(const std::string& key) const {
  const json& v = get(key);
  if (!v.is_array()) throw InputError(cat(field(key), ": expected an array, found ", v.type_name()));
  return v;
}

void JsonFields::expect_string(const std::string& key, const std::string& expected) const {
  if (string(key) != expected)
    throw InputError(cat(field(key), " = ", printable(get(key).dump().substr(0, 80)), ": expected \"", expected, "\""));
}

}  // namespace loom
