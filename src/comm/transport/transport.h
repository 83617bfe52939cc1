// The boundary algorithms see (STYLE.md rule 1): post sends and receives of byte ranges
// to peers, then wait for all of them. Messages between two ranks arrive in the order
// posted; each carries the op's Fingerprint and the receiver checks it.
//
// A transport also owns failure handling for its links: a peer that dies, leaves, or
// aborts is noticed while waiting on *any* peer, and `abort` tells every peer why this
// rank gave up, so no survivor waits for the full timeout.
// Thread-safety: one thread at a time (the communicator serializes ops).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/op.h"

namespace loom::comm {

// Data-movement collectives a transport runs natively (the mpi transport hands them to
// MPI's own, which beat point-to-point algorithms there). Each blocks until done or
// throws like Transport::wait_all; in place where the MPI call allows (`in == out`).
class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  virtual void broadcast(const Fingerprint& fp, milliseconds timeout, char* buf, size_t bytes, int root) = 0;
  virtual void all_gather(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                          size_t block_bytes) = 0;
  virtual void all_to_all(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                          size_t block_bytes) = 0;
  virtual void gather(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                      size_t block_bytes, int root) = 0;
  virtual void scatter(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                       size_t block_bytes, int root) = 0;
  virtual void barrier(const Fingerprint& fp, milliseconds timeout) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string link_kind(int peer) const = 0;

  // The bytes at `data` must stay valid and unchanged until wait_all returns.
  virtual void isend(int peer, const Fingerprint& fp, const void* data, size_t bytes) = 0;
  // The frame that arrives must carry a fingerprint matching `fp` and exactly `bytes`.
  virtual void irecv(int peer, const Fingerprint& fp, void* data, size_t bytes) = 0;
  // Completes every posted op or throws PeerLostError / TimeoutError / MismatchError /
  // CommError (a peer aborted). After a throw, posted ops are dropped.
  // `timeout`: how long a pending peer may stay silent (no byte moved) before it is
  // named in a TimeoutError.
  virtual void wait_all(milliseconds timeout, const Fingerprint& current) = 0;
  // When set, wait_all calls it whenever a pass moved no data, before blocking: the
  // communicator posts send/recv ops issued meanwhile, so an exchange whose two halves
  // were issued one after the other cannot deadlock on its own first half.
  std::function<void()> on_stall;
  // Best effort, non-blocking: tell every peer this rank failed and why.
  virtual void abort(const CommError& why) = 0;
  // Throws if any peer died, left or aborted (called by waits that are not on messages).
  virtual void check_peers(const Fingerprint& current) = 0;

  // Liveness for long waits: a waiting rank beats now and then; when a wait times out,
  // `blame` watches the beats for a moment and returns the ranks that stayed silent (a
  // stopped process cannot beat; one blocked on someone else can). Falls back to
  // `suspects` when every rank beat.
  virtual void heartbeat() = 0;
  virtual std::vector<int> blame(const std::vector<int>& suspects, milliseconds timeout) = 0;

  // Clean shutdown: tells every peer this rank left after `ops` collectives.
  virtual void goodbye(uint64_t ops) = 0;

  virtual NativeCollectives* native() { return nullptr; }
  // Transports that own their groups (mpi) make the sub-group for Communicator::split
  // here; every rank calls it, and ranks with color < 0 get null. Others return null
  // and the communicator builds links of its own.
  virtual std::unique_ptr<Transport> split(int /*color*/, int /*key*/) { return nullptr; }
  // Same-host peers, for topology, when the transport knows them without the store.
  virtual std::vector<std::string> host_ids() { return {}; }
};

// The mpi transport over MPI_COMM_WORLD (MPI initialized on first use). InputError when
// this build has none (CMake option LOOM_WITH_MPI) or the process was not started by
// mpirun with this rank and size.
std::unique_ptr<Transport> make_mpi_transport(int rank, int size, const CommConfig& config);

}  // namespace loom::comm
