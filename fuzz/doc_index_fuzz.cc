// libFuzzer target: a shard's document index (docs/data.md, "Token files and sharded
// datasets"), as `data.windows = "documents"` and `loom data fetch` read it. The input's
// first 4 bytes are the shard's token count (its manifest entry; the document count is
// the header's when in range), the rest the index file. Properties: no crash; an accepted
// index has the manifest's size, starts at 0 and increases strictly below the token
// count; anything else is an InputError naming the file.
#include <cstring>

#include "loom/data/dataset.h"
#include "reader_checks.h"

using namespace loom;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const std::string where = "fuzz/train-000000.bin.idx";
  uint32_t tokens;
  std::memcpy(&tokens, data, 4);
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 4, size - 4);
  data::ShardInfo s{.location = "train-000000.bin", .path = "fuzz/train-000000.bin", .tokens = tokens & 0x7fffffff};
  int32_t count = 0;
  if (bytes.size() >= 12) std::memcpy(&count, bytes.data() + 8, 4);
  s.documents = count >= 0 && count <= s.tokens ? count : 1;
  s.index_sha256 = std::string(64, '0');
  try {
    data::check_index_bytes(s, where, bytes);
    if (static_cast<int64_t>(bytes.size()) != 1024 + 4 * s.documents) fuzz::finding("an index of the wrong size accepted", "");
    int64_t last = -1;
    for (int64_t d = 0; d < s.documents; ++d) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + 1024 + 4 * d, 4);
      if ((d == 0 && v != 0) || static_cast<int64_t>(v) <= last || v >= s.tokens)
        fuzz::finding("an index with offsets out of order accepted", std::to_string(v));
      last = v;
    }
  } catch (const InputError& e) {
    fuzz::check_input_error(e, where);
  }
  return 0;
}
