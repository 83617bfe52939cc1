// Communicator internals shared by communicator.cc (setup, ordering, failure) and
// collectives.cc (argument checks, algorithm choice).
// Thread-safety: see Communicator in loom/comm/comm.h.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "comm/algorithms/algorithms.h"
#include "comm/op.h"
#include "comm/transport/shm/shm_window.h"
#include "comm/transport/tcp/tcp_mesh.h"
#include "loom/comm/comm.h"

namespace loom::comm {

// A non-owning reference to a `void()` callable that outlives the call: blocking ops run
// their body through it, without the allocation a std::function would cost every op.
class FnRef {
 public:
  template <typename F>
  explicit FnRef(F& f) : obj_(&f), call_([](void* o) { (*static_cast<F*>(o))(); }) {}
  void operator()() const { call_(obj_); }

 private:
  void* obj_;
  void (*call_)(void*);
};

struct OpState {
  Fingerprint fp;
  // Runs the op; for send/recv (`p2p`) only posts it: the executor waits for a batch.
  std::function<void()> run;
  bool p2p = false;
  milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // When the executor started and completed it (data parallelism reports comm_ms from it).
  // Only async ops have an OpState: a blocking op has no Work to ask, and two clock reads
  // cost a third of an 8-byte shared-memory all_reduce.
  std::chrono::steady_clock::time_point started, finished;
};

struct Communicator::Impl {
  int rank = 0, size = 1;
  CommConfig config;
  std::string name;
  Store* store = nullptr;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ShmWindow> window;  // set when every rank shares this host (and allowed)
  // When the group spans hosts: this host's window (if it has 2+ ranks and shm is allowed).
  std::unique_ptr<ShmWindow> host_window;
  Topology topo;
  std::vector<PeerInfo> peers;
  std::vector<int> local_ranks;
  std::vector<char> scratch;

  uint64_t seq = 0;  // collectives issued so far
  std::vector<uint64_t> send_seq, recv_seq;
  uint64_t splits = 0;

  // Issue order: async ops queue for the progress thread; a blocking op waits for the
  // queue to drain and runs on the caller.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<OpState>> queue;
  bool busy = false;  // the progress thread is running an op
  bool stopping = false;
  std::thread progress;
  std::exception_ptr failed;  // the first error; every later op rethrows it

  // The flight recorder's ring: each op as it ends. One thread runs a communicator's ops
  // at a time, so there is one writer; the fields are atomics so that a dump from another
  // thread reads them safely (an entry being overwritten meanwhile may read torn, never
  // undefined). A few relaxed stores an op: 8-byte all-reduces take 140 ns.
  struct Flight {
    std::atomic<uint64_t> head{0};  // kind | dtype << 8 | op << 16 | root << 32
    std::atomic<uint64_t> count{0}, seq{0};
  };
  std::array<Flight, Communicator::kFlightRecords> flight;
  std::atomic<uint64_t> flights{0};  // ops recorded so far
  mutable std::mutex flight_mu;
  std::map<uint64_t, std::string> flight_errors;  // by record number: the failed ops' errors
  void record_flight(const Fingerprint& fp, const std::exception_ptr& error);

  Fingerprint next_fp(OpKind kind, DType dt, ReduceOp op, int root, uint64_t count) {
    return {kind, dt, op, root, count, seq++};
  }
  // Queues `fn` for the progress thread, in issue order. A `p2p` fn only posts its
  // messages; the executor waits for them, `timeout` being the op's.
  Work submit_async(const Fingerprint& fp, std::function<void()> fn, bool p2p, milliseconds timeout);
  // Runs `fn` on the caller once every queued op is done; rethrows its error.
  void run_blocking(FnRef fn, const Fingerprint& fp, milliseconds timeout, bool p2p = false);
  // Runs `first`, the front of the queue (and, for send/recv, the send/recv ops right
  // behind it, taking more as they are issued while it waits), then completes each.
  // Returns how many ops it completed: the first that many of the queue.
  size_t execute(const std::shared_ptr<OpState>& first);
  // Every op runs through this: after an earlier error it runs nothing and returns that
  // error; a CommError aborts the transport (so peers learn of it), and the first error
  // sticks. For `p2p`, waits for the posted messages, calling `stall` (if set) whenever
  // the wait stalls.
  std::exception_ptr run_op(FnRef fn, const Fingerprint& fp, milliseconds timeout, bool p2p,
                            std::function<void()> stall);
  void progress_loop();
};

// The collectives' way in to a communicator's state (Communicator::impl_ is private, so that
// nothing outside comm/ reaches it).
struct CommunicatorAccess {
  static Communicator::Impl& impl(Communicator& c) { return *c.impl_; }
};

}  // namespace loom::comm
