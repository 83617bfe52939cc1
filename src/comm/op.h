// An op's fingerprint: what every rank must agree on for one collective call. It travels
// in every frame header so a rank that called something else is named (docs/formats.md,
// "Wire frames").
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <string>

#include "loom/comm/comm.h"

namespace loom::comm {

enum class OpKind : uint8_t {
  kAllReduce = 1, kReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kGather,
  kScatter, kBarrier, kSend, kRecv, kSplit
};
std::string_view op_kind_name(OpKind k);

// Which CommError subclass an error is, so an abort relayed to peers keeps its type.
enum class ErrorKind : uint8_t { kGeneric = 0, kPeerLost, kTimeout, kMismatch, kAuth };
ErrorKind error_kind_of(const CommError& e);
[[noreturn]] void throw_comm_error(ErrorKind kind, const std::string& what, int peer);

struct Fingerprint {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = -1;  // root rank, or the tag for send/recv
  uint64_t count = 0;
  uint64_t seq = 0;   // per-communicator op number (send/recv: per-peer message number)

  // send and recv are two halves of one call: they match each other.
  bool matches(const Fingerprint& o) const;
  std::string describe() const;  // "all_reduce(f32, sum, count 1000) #5"
};

}  // namespace loom::comm
