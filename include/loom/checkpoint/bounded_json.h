// JSON from files a user hands Loom, parsed within bounds proportionate to each format
// (docs/formats.md, "JSON bounds"): a size cap checked before parsing and a nesting-depth
// limit checked while parsing, so that a hostile header is refused in milliseconds and in
// bounded memory instead of being parsed into gigabytes.
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace loom {

struct JsonLimits {
  size_t max_bytes;
  int max_depth;  // objects and arrays nested inside each other, the outermost counting 1
};

// {name: {dtype, shape: [..], data_offsets: [..]}, __metadata__: {..}}
inline constexpr JsonLimits kSafetensorsHeaderLimits{size_t{16} << 20, 3};
// {tensors: [{shape: [..], shards: [{offsets: [..], extents: [..]}]}], files: {..}}, with room
// for the sharded layouts to come.
inline constexpr JsonLimits kIndexJsonLimits{size_t{32} << 20, 8};
// step, cursor, rng {streams {..}}, model {..}, config text.
inline constexpr JsonLimits kStateJsonLimits{size_t{4} << 20, 8};
// A `loom serve` request body: {model, prompt: [ids], stop: [..], ...}.
inline constexpr JsonLimits kRequestLimits{size_t{1} << 20, 3};
// One metrics.jsonl line: a flat object.
inline constexpr JsonLimits kMetricsLineLimits{size_t{1} << 20, 2};

// Parses `text` (read from `what`, a file name). InputError naming `what` when it is over
// the size cap, nested deeper than the limit, or not JSON.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& what, JsonLimits limits);

}  // namespace loom
