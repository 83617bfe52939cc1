// The tcp transport's frame header (docs/formats.md, "Wire frames") and the checks a
// receiver runs on one before it trusts any field: magic, type, the op's fingerprint,
// the payload length against the posted receive or a cap. Pure functions, so the
// fuzzer (fuzz/frame_fuzz.cc) can drive them without sockets.
// Thread-safety: pure functions on value types.
#pragma once

#include <cstdint>
#include <string>

#include "comm/op.h"

namespace loom::comm {

constexpr uint32_t kFrameMagic = 0x52464d4c;  // "LMFR"
enum class FrameType : uint8_t { kData = 1, kAbort = 2, kGoodbye = 3 };
constexpr size_t kMaxAbortText = 4096;

struct FrameHeader {  // 40 bytes, little-endian
  uint32_t magic;
  uint8_t type, kind, dtype, op;
  int32_t root;
  uint32_t pad;
  uint64_t count, seq, bytes;
};
static_assert(sizeof(FrameHeader) == 40);

FrameHeader make_header(FrameType t, const Fingerprint& fp, uint64_t bytes);
Fingerprint fingerprint_of(const FrameHeader& h);

// Checks the fields every header must have right: magic, a known type, an abort text
// under the cap. Returns the type; throws CommError naming `who` (rank `peer`).
FrameType check_header(const FrameHeader& h, const std::string& who, int peer);

// Checks a header from `who` (rank `peer`) that arrived while this rank (`rank`) waits
// for a frame of `want` carrying `want_bytes`. Returns the frame's type; a data frame
// returned here matches `want` and `want_bytes` exactly, an abort frame's text fits the
// cap. Throws CommError for a malformed header, MismatchError for another op's frame
// (only the size is compared when `fingerprints` is false).
FrameType check_frame(const FrameHeader& h, const Fingerprint& want, uint64_t want_bytes,
                      const std::string& who, int rank, int peer, bool fingerprints = true);

}  // namespace loom::comm
