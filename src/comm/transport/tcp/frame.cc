#include "comm/transport/tcp/frame.h"

namespace loom::comm {

FrameHeader make_header(FrameType t, const Fingerprint& fp, uint64_t bytes) {
  return {kFrameMagic, static_cast<uint8_t>(t), static_cast<uint8_t>(fp.kind),
          static_cast<uint8_t>(fp.dtype), static_cast<uint8_t>(fp.op), fp.root, 0, fp.count,
          fp.seq, bytes};
}

Fingerprint fingerprint_of(const FrameHeader& h) {
  return {static_cast<OpKind>(h.kind), static_cast<DType>(h.dtype), static_cast<ReduceOp>(h.op),
          h.root, h.count, h.seq};
}

FrameType check_header(const FrameHeader& h, const std::string& who, int peer) {
  if (h.magic != kFrameMagic) throw CommError(cat(who, " sent a frame with bad magic: stream out of step"), peer);
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kGoodbye:
    case FrameType::kData: return static_cast<FrameType>(h.type);
    case FrameType::kAbort:
      if (h.bytes > kMaxAbortText)
        throw CommError(cat(who, " sent an abort frame of ", h.bytes, " bytes (cap ", kMaxAbortText, ")"), peer);
      return FrameType::kAbort;
  }
  throw CommError(cat(who, " sent a frame of unknown type ", int(h.type)), peer);
}

FrameType check_frame(const FrameHeader& h, const Fingerprint& want, uint64_t want_bytes,
                      const std::string& who, int rank, int peer, bool fingerprints) {
  if (FrameType t = check_header(h, who, peer); t != FrameType::kData) return t;
  Fingerprint theirs = fingerprint_of(h);
  if (fingerprints && !theirs.matches(want))
    throw MismatchError(cat("mismatched collectives: this rank (rank ", rank, ") called ", want.describe(),
                            " but ", who, " called ", theirs.describe()),
                        peer);
  if (h.bytes != want_bytes)
    throw CommError(cat(who, " sent ", h.bytes, " bytes for ", want.describe(), ", expected ", want_bytes), peer);
  return FrameType::kData;
}

}  // namespace loom::comm
