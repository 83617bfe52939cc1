#include "loom/checkpoint/bounded_json.h"

#include <set>
#include <vector>

#include "loom/core/error.h"

namespace loom {
using json = nlohmann::json;

json parse_json_bounded(std::string_view text, const std::string& what, JsonLimits limits) {
  if (text.size() > limits.max_bytes)
    throw InputError(cat(what, ": ", text.size(), " bytes of JSON, over the ", limits.max_bytes,
                         "-byte limit of its format"));
  // The parser reports each object or array as it opens, with the depth of its parent: the
  // walk stops at the first one too deep, before anything under it is allocated. A key
  // given twice in one object is refused too: which of the two a reader sees would
  // otherwise depend on the parser (this one keeps the last).
  struct TooDeep {};
  struct Duplicate {
    std::string key;
  };
  std::vector<std::set<std::string>> keys;  // of each object open on the way down
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= limits.max_depth)
      throw TooDeep{};
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw Duplicate{parsed.get<std::string>()};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const TooDeep&) {
    throw InputError(cat(what, ": JSON nested deeper than ", limits.max_depth, " levels, the most its format has"));
  } catch (const Duplicate& d) {
    throw InputError(cat(what, ": key \"", printable(d.key), "\" given twice in one object"));
  } catch (const json::exception& e) {
    throw InputError(cat(what, ": not JSON (", e.what(), ")"));
  }
}

}  // namespace loom
