// libFuzzer target: the token file reader (llm.c's format: a 256-word header, then uint16
// tokens), as `loom train` and `loom eval` read data.train and data.val. The input is a
// whole file. Properties: no crash; a file that parses holds exactly the header's count of
// tokens, the bytes after the header; anything else is an InputError naming the file.
#include <cstring>

#include "loom/data/data.h"
#include "reader_checks.h"

using namespace loom;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz/train.bin";
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const std::vector<uint16_t> tokens = data::parse_tokens(path, bytes);
    constexpr size_t kHeader = data::kTokenHeaderWords * sizeof(int32_t);
    if (kHeader + tokens.size() * sizeof(uint16_t) != size) std::abort();
    if (!tokens.empty() && std::memcmp(tokens.data(), data + kHeader, tokens.size() * sizeof(uint16_t)) != 0) std::abort();
  } catch (const InputError& e) {
    fuzz::check_input_error(e, path);
  }
  return 0;
}
