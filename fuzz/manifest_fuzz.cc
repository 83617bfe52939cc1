// libFuzzer target: a dataset manifest (docs/data.md), as `loom train` and `loom data fetch`
// read data.train. The input is the whole file. Properties: no crash; an accepted manifest
// has at least one shard, each a path or an http(s) URL, a count in [0, 2^31 - 1], 2- or
// 4-byte ids and 64 hex digits of SHA-256, a document count (if any) in [1, count] with its
// index's SHA-256, and its token total is their sum; anything else
// is an InputError naming the file.
#include "loom/data/dataset.h"
#include "reader_checks.h"

using namespace loom;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz/train.json";
  try {
    const data::Manifest m = data::parse_manifest(path, std::string_view(reinterpret_cast<const char*>(data), size));
    if (m.shards.empty()) fuzz::finding("a manifest without shards accepted", "");
    int64_t total = 0;
    for (const data::ShardInfo& s : m.shards) {
      if (s.tokens < 0 || s.tokens > INT32_MAX) fuzz::finding("a shard count out of range", std::to_string(s.tokens));
      if (s.dtype_bytes != 2 && s.dtype_bytes != 4) fuzz::finding("a shard dtype out of range", std::to_string(s.dtype_bytes));
      if (s.sha256.size() != 64) fuzz::finding("a shard hash not 64 digits", s.sha256);
      if (s.location.empty()) fuzz::finding("a shard without a location", "");
      if (s.path.empty() && !s.location.starts_with("http://") && !s.location.starts_with("https://"))
        fuzz::finding("a remote shard that is not http(s)", s.location);
      if (s.documents >= 0 && (s.documents > s.tokens || (s.documents == 0) != (s.tokens == 0) || s.index_sha256.size() != 64))
        fuzz::finding("a shard's document index out of range", std::to_string(s.documents));
      total += s.tokens;
    }
    if (total != m.tokens) fuzz::finding("a token total that is not the shards' sum", std::to_string(m.tokens));
  } catch (const InputError& e) {
    fuzz::check_input_error(e, path);
  }
  return 0;
}
