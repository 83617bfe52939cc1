// The boundary algorithms see (STYLE.md rule 1): post sends and receives of byte ranges
// to peers, then wait for all of them. Messages between two ranks arrive in the order
// posted; each carries the op's Fingerprint and the receiver checks it.
//
// A transport also owns failure handling for its links: a peer that dies, leaves, or
// aborts is noticed while waiting on *any* peer, and `abort` tells every peer why this
// rank gave up, so no survivor waits for the full timeout.
//
// Same-host groups may also expose a ShmWindow (shared staging memory) that shm-direct
// algorithms use instead of messages; `window()` is null where there is none.
// Thread-safety: one thread at a time (the communicator serializes ops).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/op.h"

namespace loom::comm {

class ShmWindow;

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

  virtual ShmWindow* window() { return nullptr; }
};

}  // namespace loom::comm
