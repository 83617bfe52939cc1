// libFuzzer target: the text files of a checkpoint directory, each read the way
// Checkpoint::open reads it: index.json (versions 1 and 2, with the shards' geometry) and
// state.json through the bounded JSON parser and their schemas, and the `latest` pointer. Every input goes to all three. Properties:
// no crash, no library exception (nlohmann's type errors included) escaping; what parses
// is in range (docs/formats.md); anything else is an InputError naming the file.
#include "checkpoint/schema.h"
#include "loom/checkpoint/bounded_json.h"
#include "reader_checks.h"

using namespace loom;
using namespace loom::checkpoint;

namespace {

const std::string kIndex = "fuzz/step_3/index.json", kState = "fuzz/step_3/state.json", kLatest = "fuzz/latest";

// What parse_index promises: every shard a non-empty block inside its tensor, in a listed
// file, the blocks' sizes summing to the tensor's; and check_tiling then refuses overlaps
// without crashing (run where the tensor is small enough for its bitmap).
void index_in_range(const Index& index) {
  for (const IndexedTensor& t : index.tensors) {
    int64_t numel = 1, covered = 0;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      numel *= d;
    }
    for (const IndexedShard& s : t.shards) {
      if (!index.files.contains(s.file) || s.box.offsets.size() != t.shape.size()) std::abort();
      for (size_t d = 0; d < t.shape.size(); ++d)
        if (s.box.offsets[d] < 0 || s.box.extents[d] < 1 || s.box.offsets[d] + s.box.extents[d] > t.shape[d]) std::abort();
      covered += s.box.numel();
    }
    if (covered != numel) std::abort();
    if (numel <= (int64_t{1} << 24)) {
      try {
        check_tiling(t, kIndex);
      } catch (const InputError& e) {
        fuzz::check_input_error(e, kIndex);
      }
    }
  }
  for (const auto& [name, file] : index.files)
    if (file.bytes < 0 || file.sha256.size() != 64) std::abort();
}

void state_in_range(const State& s) {
  if (s.step < 0 || s.optimizer_steps < 0 || s.optimizer_steps > s.step) std::abort();
  if (s.data_cursor && *s.data_cursor < 0) std::abort();
  if (!s.model.is_null()) {
    if (!s.model.is_object()) std::abort();
    for (const auto& [key, value] : s.model.items())
      if (key != "kind" && (!value.is_number_integer() || value.get<int64_t>() < 1)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    index_in_range(parse_index(parse_json_bounded(text, kIndex, kIndexJsonLimits), kIndex));
  } catch (const InputError& e) {
    fuzz::check_input_error(e, kIndex);
  }
  try {
    state_in_range(parse_state(parse_json_bounded(text, kState, kStateJsonLimits), kState));
  } catch (const InputError& e) {
    fuzz::check_input_error(e, kState);
  }
  try {
    const std::string name = parse_latest(text, kLatest);
    if (!name.starts_with("step_") || name.size() > 24) std::abort();
  } catch (const InputError& e) {
    fuzz::check_input_error(e, kLatest);
  }
  return 0;
}
