#include "loom/bounded_json.h"

#include "loom/error.h"

namespace loom {
using json = nlohmann::json;

json parse_json_bounded(std::string_view text, const std::string& what, JsonLimits limits) {
  if (text.size() > limits.max_bytes)
    throw InputError(cat(what, ": ", text.size(), " bytes of JSON, over the ", limits.max_bytes,
                         "-byte limit of its format"));
  // The parser reports each object or array as it opens, with the depth of its parent: the
  // walk stops at the first one too deep, before anything under it is allocated.
  struct TooDeep {};
  auto depth_check = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= limits.max_depth)
      throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_check);
  } catch (const TooDeep&) {
    throw InputError(cat(what, ": JSON nested deeper than ", limits.max_depth, " levels, the most its format has"));
  } catch (const json::exception& e) {
    throw InputError(cat(what, ": not JSON (", e.what(), ")"));
  }
}

}  // namespace loom
