#include "comm/op.h"

#include <algorithm>

namespace loom::comm {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kSplit: return "split";
  }
  return "unknown op";
}

ErrorKind error_kind_of(const CommError& e) {
  if (dynamic_cast<const PeerLostError*>(&e)) return ErrorKind::kPeerLost;
  if (dynamic_cast<const TimeoutError*>(&e)) return ErrorKind::kTimeout;
  if (dynamic_cast<const MismatchError*>(&e)) return ErrorKind::kMismatch;
  if (dynamic_cast<const AuthError*>(&e)) return ErrorKind::kAuth;
  return ErrorKind::kGeneric;
}

void throw_comm_error(ErrorKind kind, const std::string& what, int peer) {
  switch (kind) {
    case ErrorKind::kPeerLost: throw PeerLostError(what, peer);
    case ErrorKind::kTimeout: throw TimeoutError(what, peer);
    case ErrorKind::kMismatch: throw MismatchError(what, peer);
    case ErrorKind::kAuth: throw AuthError(what, peer);
    case ErrorKind::kGeneric: break;
  }
  throw CommError(what, peer);
}

bool Fingerprint::matches(const Fingerprint& o) const {
  auto norm = [](OpKind k) { return k == OpKind::kRecv ? OpKind::kSend : k; };
  return norm(kind) == norm(o.kind) && dtype == o.dtype && op == o.op && root == o.root &&
         count == o.count && seq == o.seq;
}

std::string Fingerprint::describe() const {
  // Fingerprints come off the wire too: a value out of range is shown, never trusted.
  constexpr DType kKnown[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                              DType::kI32, DType::kI64, DType::kU8,   DType::kU16, DType::kI8};
  bool known = std::find(std::begin(kKnown), std::end(kKnown), dtype) != std::end(kKnown);
  std::string s = cat(op_kind_name(kind), "(",
                      known ? std::string(dtype_name(dtype)) : cat("dtype ", int(dtype)));
  switch (kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter: s += cat(", ", reduce_op_name(op)); break;
    case OpKind::kReduce: s += cat(", ", reduce_op_name(op), ", root ", root); break;
    case OpKind::kBroadcast:
    case OpKind::kGather:
    case OpKind::kScatter: s += cat(", root ", root); break;
    case OpKind::kSend:
    case OpKind::kRecv: s += cat(", tag ", root); break;
    default: break;
  }
  return s + cat(", count ", count, ") #", seq);
}

}  // namespace loom::comm
