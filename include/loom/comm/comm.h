// Collective communication: a Communicator is a group of ranks that move bytes together.
//
// One collective = one free function + one Options struct (STYLE.md rule 2). Each has a
// blocking form (`all_reduce(comm, opts)`) and an async form (`all_reduce_async`) that
// returns a Work handle. Ops run in issue order: async ops on the communicator's progress
// thread, so the caller can compute meanwhile; a blocking call first waits for the async
// ops issued before it, then runs on the calling thread (no thread hand-off, so small
// messages stay fast).
//
// Buffers: counts are in elements of `dtype`. `input == nullptr` (or input == output)
// means in place. The caller owns every buffer and keeps it alive and untouched until
// the op completes (for async ops: until Work::wait returns).
//
// Never a silent hang: every op has a deadline (Options::timeout, else the
// communicator's CommConfig::timeout). Every message carries the op's fingerprint (op,
// dtype, count, root, sequence number), so ranks calling different collectives fail
// with a MismatchError naming both calls. A dead peer raises PeerLostError naming it, a
// silent one TimeoutError. After any such error the communicator is aborted: every rank
// is told, and every later op fails at once with the first error.
//
// Reductions are deterministic: each algorithm combines contributions in a fixed order
// that depends only on the world size, so reruns give identical bits. bf16 and f16 are
// accumulated in f32 (see docs/algorithms.md for where partial sums are rounded).
//
// Thread-safety: one thread issues ops on a communicator (any thread, but not two at
// once). Work handles may be waited on from any thread. Different communicators are
// independent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::comm {

class Store;
class Communicator;
struct OpState;

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using std::chrono::milliseconds;

enum class ReduceOp : uint8_t { kSum = 0, kAvg, kMin, kMax, kProd };
std::string_view reduce_op_name(ReduceOp op);

// kAuto picks by message size, group size and topology (docs/algorithms.md).
// kHierarchical applies to all_reduce, reduce and broadcast (others fall back to auto).
enum class Algorithm : uint8_t { kAuto = 0, kRing, kTree, kShmDirect, kHierarchical };
std::string_view algorithm_name(Algorithm a);
Algorithm algorithm_from_name(std::string_view name);  // InputError on an unknown name

// ---- errors (all RuntimeError: exit code 1 at the CLI edge) ----
// `peer` is the rank the error is about (-1 when none).
class CommError : public RuntimeError {
 public:
  CommError(const std::string& what, int peer) : RuntimeError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};
class PeerLostError : public CommError {  // the peer died or closed its connection
 public:
  using CommError::CommError;
};
class TimeoutError : public CommError {  // the peer said nothing before the deadline
 public:
  using CommError::CommError;
};
class MismatchError : public CommError {  // ranks called different collectives
 public:
  using CommError::CommError;
};
class AuthError : public CommError {  // wrong secret, other job, duplicate rank, ...
 public:
  using CommError::CommError;
};

// How ranks reach each other. Defaults in the declaration (STYLE.md rule 5).
struct CommConfig {
  std::string transport = "auto";  // auto (same host -> shm, else tcp) | shm | tcp | mpi
  milliseconds timeout{30000};     // per op: a peer silent this long is named
  std::string bind_address = "127.0.0.1";  // where this rank listens for tcp peers
  bool check_fingerprints = true;          // op mismatch detection
  size_t shm_slot_bytes = 1 << 20;         // shared-memory staging per rank per slot
  std::string job_id = "default";          // peers of another job are refused
  std::string secret;  // per-job HMAC key; empty only with loopback and threads
  // Which machine this rank is on, for topology (same id -> same host). Empty: detected
  // from hostname, boot id and network namespace (join_world sets it from $LOOM_HOST_ID).
  std::string host_id;
  // The job rank of each member, so that errors name ranks as the job knows them; split
  // fills it for sub-groups. Empty: the group's own ranks.
  std::vector<int> job_ranks;
  int job_rank(int r) const { return r >= 0 && r < static_cast<int>(job_ranks.size()) ? job_ranks[r] : r; }
};

// Memory that this rank's peers on the same host map too, so that collectives whose
// input lies in it skip the copy into the shared window: peers read it in place
// (docs/algorithms.md, "Shared inputs"). Where the group has no shared window (tcp or
// mpi transport, several hosts, one rank) it is ordinary memory and shared() is false.
// Zeroed, page-aligned. Move-only in effect (copies share the memory); the memory lives
// while any copy does, even past the communicator.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  char* data() const { return data_; }
  size_t size() const { return size_; }
  bool shared() const { return shared_; }

 private:
  friend class Communicator;
  char* data_ = nullptr;
  size_t size_ = 0;
  bool shared_ = false;
  std::shared_ptr<void> hold_;  // the mappings, or the heap block
};

// A group of ranks. Create with Communicator::create (world) or split (sub-group).
class Communicator {
 public:
  // Joins the group `size` ranks strong through `store`; blocks until every rank has
  // joined and every link is authenticated, or throws a CommError naming who is missing.
  // `name` keeps groups that share a store apart. `store` must outlive the communicator
  // (split uses it). REQUIRES: 0 <= rank < size.
  static std::unique_ptr<Communicator> create(Store& store, int rank, int size,
                                              const CommConfig& config,
                                              const std::string& name = "world");
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const CommConfig& config() const;
  // Ranks sharing this rank's host, in rank order (from the hostname and boot id).
  const std::vector<int>& local_ranks() const;
  // Per peer: "shm", "tcp" or "mpi" (what carries bytes to that rank); "self" for us.
  std::string link_kind(int peer) const;

  // Collective over this group: every rank calls it, in the same order as its other
  // alloc_shared calls (sizes may differ), and releases the buffers alike. Throws
  // CommError when /dev/shm cannot hold `bytes`.
  SharedBuffer alloc_shared(size_t bytes);

  // Collective over this group: ranks with equal `color` form a sub-group, ordered by
  // (key, old rank). color < 0 means "not in any sub-group" (returns nullptr).
  std::unique_ptr<Communicator> split(int color, int key);

  // The flight recorder: the last kFlightRecords ops this rank ran on this communicator,
  // oldest first, then the async ops still queued. Any thread; for the dump after a failure.
  struct FlightRecord {
    uint64_t seq = 0;     // the op's sequence number (send/recv: per peer)
    std::string op;       // its fingerprint, e.g. "all_reduce(f32, sum, count 1000) #5"
    std::string state;    // "completed", "failed" or "queued or running"
    std::string error;    // what a failed op raised
  };
  static constexpr size_t kFlightRecords = 64;
  std::vector<FlightRecord> flight_record() const;

  struct Impl;  // src/comm/communicator_impl.h: the collectives reach it, nothing else does

 private:
  friend struct CommunicatorAccess;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Handle to an async op. Move-only; destroying an unfinished Work waits for it.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<OpState> s) : state_(std::move(s)) {}
  Work(Work&&) = default;
  Work& operator=(Work&&) = default;
  ~Work();
  // Blocks until the op completes; rethrows its CommError. Throws TimeoutError if the op
  // has not completed by `deadline` (the op itself goes on and fails at its own timeout).
  void wait(Deadline deadline = Deadline::max());
  bool done() const;      // true for a handle with no op
  bool valid() const { return state_ != nullptr; }  // holds an op (started, maybe done)
  // When the progress thread started and completed the op. REQUIRES: a waited-for op.
  std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point> span() const;

 private:
  std::shared_ptr<OpState> state_;
};

// ---- collectives ----
// `timeout` of zero means the communicator's CommConfig::timeout.

struct AllReduceOptions {
  const void* input = nullptr;  // (count); nullptr: in place on output
  void* output = nullptr;       // (count)
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  milliseconds timeout{0};
};
void all_reduce(Communicator& comm, const AllReduceOptions& o);
Work all_reduce_async(Communicator& comm, const AllReduceOptions& o);

struct ReduceOptions {
  const void* input = nullptr;  // (count); nullptr: in place on output
  void* output = nullptr;       // (count); written on root only (may be null elsewhere
                                // unless in place)
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Algorithm algorithm = Algorithm::kAuto;
  milliseconds timeout{0};
};
void reduce(Communicator& comm, const ReduceOptions& o);
Work reduce_async(Communicator& comm, const ReduceOptions& o);

struct BroadcastOptions {
  void* buffer = nullptr;  // (count): read on root, written elsewhere
  size_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  Algorithm algorithm = Algorithm::kAuto;
  milliseconds timeout{0};
};
void broadcast(Communicator& comm, const BroadcastOptions& o);
Work broadcast_async(Communicator& comm, const BroadcastOptions& o);

struct AllGatherOptions {
  const void* input = nullptr;  // (count); nullptr: in place, already at output[rank*count]
  void* output = nullptr;       // (size, count)
  size_t count = 0;             // per rank
  DType dtype = DType::kF32;
  Algorithm algorithm = Algorithm::kAuto;
  milliseconds timeout{0};
};
void all_gather(Communicator& comm, const AllGatherOptions& o);
Work all_gather_async(Communicator& comm, const AllGatherOptions& o);

struct ReduceScatterOptions {
  const void* input = nullptr;  // (size, count)
  void* output = nullptr;       // (count): this rank's block of the reduction
  size_t count = 0;             // per rank
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  milliseconds timeout{0};
};
void reduce_scatter(Communicator& comm, const ReduceScatterOptions& o);
Work reduce_scatter_async(Communicator& comm, const ReduceScatterOptions& o);

struct AllToAllOptions {
  const void* input = nullptr;  // (size, count): block j goes to rank j
  void* output = nullptr;       // (size, count): block j came from rank j
  size_t count = 0;             // per pair
  DType dtype = DType::kF32;
  milliseconds timeout{0};
};
void all_to_all(Communicator& comm, const AllToAllOptions& o);
Work all_to_all_async(Communicator& comm, const AllToAllOptions& o);

struct GatherOptions {
  const void* input = nullptr;  // (count)
  void* output = nullptr;       // (size, count) on root; ignored elsewhere
  size_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  milliseconds timeout{0};
};
void gather(Communicator& comm, const GatherOptions& o);
Work gather_async(Communicator& comm, const GatherOptions& o);

struct ScatterOptions {
  const void* input = nullptr;  // (size, count) on root; ignored elsewhere
  void* output = nullptr;       // (count)
  size_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  milliseconds timeout{0};
};
void scatter(Communicator& comm, const ScatterOptions& o);
Work scatter_async(Communicator& comm, const ScatterOptions& o);

struct BarrierOptions {
  milliseconds timeout{0};
};
void barrier(Communicator& comm, const BarrierOptions& o = {});
Work barrier_async(Communicator& comm, const BarrierOptions& o = {});

// Point to point. Messages between two ranks arrive in the order sent; `tag` must match
// on both sides (a mismatch is a MismatchError). send/recv are ops like the others, so
// they keep their place in the issue order.
struct SendOptions {
  const void* buffer = nullptr;  // (count)
  size_t count = 0;
  DType dtype = DType::kF32;
  int peer = 0;
  uint32_t tag = 0;
  milliseconds timeout{0};
};
void send(Communicator& comm, const SendOptions& o);
Work send_async(Communicator& comm, const SendOptions& o);

struct RecvOptions {
  void* buffer = nullptr;  // (count)
  size_t count = 0;
  DType dtype = DType::kF32;
  int peer = 0;
  uint32_t tag = 0;
  milliseconds timeout{0};
};
void recv(Communicator& comm, const RecvOptions& o);
Work recv_async(Communicator& comm, const RecvOptions& o);

}  // namespace loom::comm
