// libFuzzer target: the tcp transport's frame header checks. The input is a 40-byte
// header as received, then the fingerprint and size of the receive this rank posted.
// Properties: no crash on any field value (op kinds, dtypes and reduce ops out of range
// included), and a data frame is accepted only when it matches the posted receive.
#include <cstdlib>
#include <cstring>

#include "comm/transport/tcp/frame.h"

using namespace loom::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FrameHeader h{};
  Fingerprint want;
  uint64_t want_bytes = 0;
  std::memcpy(&h, data, std::min(size, sizeof h));
  if (size > sizeof h) {
    size_t n = std::min(size - sizeof h, sizeof want);
    std::memcpy(&want, data + sizeof h, n);
    if (size > sizeof h + sizeof want)
      std::memcpy(&want_bytes, data + sizeof h + sizeof want, std::min(size - sizeof h - sizeof want, sizeof want_bytes));
  }
  try {
    if (check_frame(h, want, want_bytes, "rank 1", 0, 1) == FrameType::kData &&
        (!fingerprint_of(h).matches(want) || h.bytes != want_bytes))
      std::abort();
  } catch (const CommError& e) {
    if (std::strlen(e.what()) == 0) std::abort();
  }
  (void)want.describe();
  (void)fingerprint_of(h).describe();
  return 0;
}
