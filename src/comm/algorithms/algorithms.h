// Collective algorithms. Each sees only the transport interface: never sockets, never the
// store, never the shared window's insides (the shm-direct collectives, declared here,
// live beside the window in comm/transport/shm/shm_collectives.cc). docs/algorithms.md
// gives steps, bytes on the wire and when each is chosen.
//
// Buffers here are bytes plus an element count; `in` may equal `out` (in place). Every
// function runs the whole op on the calling thread and throws CommError on failure.
// Thread-safety: one op at a time per transport.
#pragma once

#include <vector>

#include "comm/copy.h"
#include "comm/op.h"
#include "comm/transport/transport.h"

namespace loom::comm {

class ShmWindow;

struct OpContext {
  Transport& t;
  Fingerprint fp;
  milliseconds timeout;
  std::vector<char>& scratch;  // reusable workspace, grown on demand
  size_t chunk_bytes = 512 << 10;  // pipelining unit for ring and tree
  int rank() const { return t.rank(); }
  int size() const { return t.size(); }
  void send(int peer, const void* p, size_t n) { t.isend(peer, fp, p, n); }
  void recv(int peer, void* p, size_t n) { t.irecv(peer, fp, p, n); }
  void wait() { t.wait_all(timeout, fp); }
  char* workspace(size_t n);
};

// Block b of `count` elements split over n ranks: [block_begin(b), block_begin(b+1)).
inline size_t block_begin(size_t count, int n, int b) { return count * static_cast<size_t>(b) / n; }

// ring: bandwidth-optimal, 2(n-1) steps, 2(n-1)/n * S bytes sent per rank.
void ring_all_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op);
void ring_reduce_scatter(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op);
void ring_all_gather(OpContext& c, const char* in, char* out, size_t count, DType dt);

// tree: latency-optimal, ceil(log2 n) steps (recursive doubling / binomial trees).
void tree_all_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op);
void tree_broadcast(OpContext& c, char* buf, size_t bytes, int root);
void tree_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op, int root);

// direct: every rank talks to the ranks it needs, all messages posted at once.
void direct_all_to_all(OpContext& c, const char* in, char* out, size_t block_bytes);
void direct_gather(OpContext& c, const char* in, char* out, size_t block_bytes, int root);
void direct_scatter(OpContext& c, const char* in, char* out, size_t block_bytes, int root);
void dissemination_barrier(OpContext& c);

// shm-direct: same-host groups through the shared window; one copy in, one copy out.
void shm_all_reduce(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count, DType dt,
                    ReduceOp op);
void shm_reduce(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count, DType dt,
                ReduceOp op, int root);
void shm_reduce_scatter(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count,
                        DType dt, ReduceOp op);
void shm_all_gather(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes);
void shm_broadcast(OpContext& c, ShmWindow& w, char* buf, size_t bytes, int root);
void shm_all_to_all(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes);
void shm_gather(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes, int root);
void shm_scatter(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes, int root);
void shm_barrier(OpContext& c, ShmWindow& w);

// Where a group's ranks live: ranks grouped by host (ascending within a host; hosts in
// order of their lowest rank), this rank's host, and that host's shared window (null
// when the host has one rank or shm is off).
struct Topology {
  std::vector<std::vector<int>> hosts;
  int host = 0;
  ShmWindow* window = nullptr;
};

// hierarchical: same-host reduce, cross-host ring or tree among one rank per host,
// same-host broadcast (reduce and broadcast likewise, with the root speaking for its host).
void hier_all_reduce(OpContext& c, const Topology& topo, const char* in, char* out, size_t count,
                     DType dt, ReduceOp op);
void hier_reduce(OpContext& c, const Topology& topo, const char* in, char* out, size_t count,
                 DType dt, ReduceOp op, int root);
void hier_broadcast(OpContext& c, const Topology& topo, char* buf, size_t bytes, int root);

}  // namespace loom::comm
