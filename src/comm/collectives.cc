// The collective free functions: check arguments, stamp the fingerprint, pick the
// algorithm (docs/algorithms.md, "Choosing"), and hand the op to the issue-order queue.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator_impl.h"
#include "comm/reduce.h"

namespace loom::comm {
namespace {

constexpr size_t kTreeMaxBytes = 64 << 10;  // tcp: recursive doubling at or below

using Impl = Communicator::Impl;

// The message is formatted only when the check fails: this runs on every op, and
// formatting it eagerly cost more than a whole 8-byte all_reduce.
template <typename... Parts>
void need(bool ok, const Parts&... what) {
  if (!ok) throw InputError(cat(what...));
}

void check_root(const Impl& m, int root, std::string_view op) {
  need(root >= 0 && root < m.size, op, ": root ", root, " is out of range for ", m.size, " ranks");
}

void check_buffer(const void* p, size_t count, std::string_view op, std::string_view which) {
  need(p != nullptr || count == 0, op, ": ", which, " is null but count is ", count);
}

milliseconds timeout_of(const Impl& m, milliseconds t) { return t.count() > 0 ? t : m.config.timeout; }

// `hierarchical`: whether the op has a hierarchical form (all_reduce, reduce, broadcast).
Algorithm resolve(const Impl& m, Algorithm a, size_t bytes, std::string_view op, bool hierarchical) {
  if (a == Algorithm::kShmDirect)
    need(m.window != nullptr || m.size == 1, op,
         ": algorithm shm-direct needs every rank on one host with transport auto or shm");
  if (a == Algorithm::kHierarchical && !hierarchical) a = Algorithm::kAuto;
  if (a != Algorithm::kAuto) return a;
  if (m.window) return Algorithm::kShmDirect;
  const auto& hosts = m.topo.hosts;
  bool shared_host = std::any_of(hosts.begin(), hosts.end(), [](const auto& h) { return h.size() > 1; });
  if (hierarchical && hosts.size() > 1 && shared_host) return Algorithm::kHierarchical;
  return bytes <= kTreeMaxBytes ? Algorithm::kTree : Algorithm::kRing;
}

// Runs `body(OpContext&)` in issue order with the op's fingerprint. For send/recv
// (`p2p`), `body` only posts; the executor waits, batching send/recv ops issued back to
// back so that both halves of an exchange are in flight together.
template <typename Body>
Work run(Communicator& comm, const Fingerprint& fp, milliseconds timeout, bool async, Body body,
         bool p2p = false) {
  Impl& m = CommunicatorAccess::impl(comm);
  auto t = timeout_of(m, timeout);
  auto op = [&m, fp, t, body]() mutable {
    OpContext c{*m.transport, fp, t, m.scratch};
    body(c);
  };
  if (async) return m.submit_async(fp, std::move(op), p2p, t);
  m.run_blocking(FnRef(op), fp, t, p2p);
  return Work();
}

Work do_all_reduce(Communicator& comm, const AllReduceOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_reducible(o.dtype, o.op);
  check_buffer(o.output, o.count, "all_reduce", "output");
  const char* in = static_cast<const char*>(o.input ? o.input : o.output);
  char* out = static_cast<char*>(o.output);
  Algorithm a = resolve(m, o.algorithm, o.count * dtype_size(o.dtype), "all_reduce", true);
  auto fp = m.next_fp(OpKind::kAllReduce, o.dtype, o.op, -1, o.count);
  return run(comm, fp, o.timeout, async, [&m, a, in, out, o](OpContext& c) {
    if (a == Algorithm::kShmDirect && m.size > 1) return shm_all_reduce(c, *m.window, in, out, o.count, o.dtype, o.op);
    if (a == Algorithm::kHierarchical) return hier_all_reduce(c, m.topo, in, out, o.count, o.dtype, o.op);
    if (a == Algorithm::kRing) return ring_all_reduce(c, in, out, o.count, o.dtype, o.op);
    tree_all_reduce(c, in, out, o.count, o.dtype, o.op);
  });
}

Work do_reduce(Communicator& comm, const ReduceOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_reducible(o.dtype, o.op);
  check_root(m, o.root, "reduce");
  const char* in = static_cast<const char*>(o.input ? o.input : o.output);
  check_buffer(in, o.count, "reduce", "input");
  if (m.rank == o.root) check_buffer(o.output, o.count, "reduce", "output on the root");
  char* out = static_cast<char*>(o.output);
  Algorithm a = resolve(m, o.algorithm, o.count * dtype_size(o.dtype), "reduce", true);
  auto fp = m.next_fp(OpKind::kReduce, o.dtype, o.op, o.root, o.count);
  return run(comm, fp, o.timeout, async, [&m, a, in, out, o](OpContext& c) {
    if (a == Algorithm::kShmDirect && m.size > 1)
      return shm_reduce(c, *m.window, in, out, o.count, o.dtype, o.op, o.root);
    if (a == Algorithm::kHierarchical) return hier_reduce(c, m.topo, in, out, o.count, o.dtype, o.op, o.root);
    tree_reduce(c, in, out, o.count, o.dtype, o.op, o.root);
  });
}

Work do_broadcast(Communicator& comm, const BroadcastOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_root(m, o.root, "broadcast");
  check_buffer(o.buffer, o.count, "broadcast", "buffer");
  size_t bytes = o.count * dtype_size(o.dtype);
  Algorithm a = resolve(m, o.algorithm, bytes, "broadcast", true);
  auto fp = m.next_fp(OpKind::kBroadcast, o.dtype, ReduceOp::kSum, o.root, o.count);
  char* buf = static_cast<char*>(o.buffer);
  NativeCollectives* native = o.algorithm == Algorithm::kAuto ? m.transport->native() : nullptr;
  return run(comm, fp, o.timeout, async, [&m, a, buf, bytes, o, native](OpContext& c) {
    if (native) return native->broadcast(c.fp, c.timeout, buf, bytes, o.root);
    if (a == Algorithm::kShmDirect && m.size > 1) return shm_broadcast(c, *m.window, buf, bytes, o.root);
    if (a == Algorithm::kHierarchical) return hier_broadcast(c, m.topo, buf, bytes, o.root);
    tree_broadcast(c, buf, bytes, o.root);
  });
}

Work do_all_gather(Communicator& comm, const AllGatherOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_buffer(o.output, o.count, "all_gather", "output");
  size_t es = dtype_size(o.dtype);
  char* out = static_cast<char*>(o.output);
  const char* in = o.input ? static_cast<const char*>(o.input) : out + m.rank * o.count * es;
  Algorithm a = resolve(m, o.algorithm, o.count * es * m.size, "all_gather", false);
  auto fp = m.next_fp(OpKind::kAllGather, o.dtype, ReduceOp::kSum, -1, o.count);
  NativeCollectives* native = o.algorithm == Algorithm::kAuto ? m.transport->native() : nullptr;
  return run(comm, fp, o.timeout, async, [&m, a, in, out, o, es, native](OpContext& c) {
    if (native) return native->all_gather(c.fp, c.timeout, in, out, o.count * es);
    if (a == Algorithm::kShmDirect && m.size > 1) return shm_all_gather(c, *m.window, in, out, o.count * es);
    ring_all_gather(c, in, out, o.count, o.dtype);
  });
}

Work do_reduce_scatter(Communicator& comm, const ReduceScatterOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_reducible(o.dtype, o.op);
  check_buffer(o.output, o.count, "reduce_scatter", "output");
  check_buffer(o.input, o.count, "reduce_scatter", "input");
  size_t es = dtype_size(o.dtype);
  const char* in = static_cast<const char*>(o.input);
  char* out = static_cast<char*>(o.output);
  Algorithm a = resolve(m, o.algorithm, o.count * es * m.size, "reduce_scatter", false);
  auto fp = m.next_fp(OpKind::kReduceScatter, o.dtype, o.op, -1, o.count);
  return run(comm, fp, o.timeout, async, [&m, a, in, out, o](OpContext& c) {
    if (a == Algorithm::kShmDirect && m.size > 1)
      return shm_reduce_scatter(c, *m.window, in, out, o.count, o.dtype, o.op);
    ring_reduce_scatter(c, in, out, o.count, o.dtype, o.op);
  });
}

Work do_all_to_all(Communicator& comm, const AllToAllOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_buffer(o.output, o.count, "all_to_all", "output");
  size_t block = o.count * dtype_size(o.dtype);
  char* out = static_cast<char*>(o.output);
  const char* in = o.input ? static_cast<const char*>(o.input) : out;
  auto fp = m.next_fp(OpKind::kAllToAll, o.dtype, ReduceOp::kSum, -1, o.count);
  return run(comm, fp, o.timeout, async, [&m, in, out, block](OpContext& c) {
    if (auto* native = m.transport->native()) return native->all_to_all(c.fp, c.timeout, in, out, block);
    if (m.window) return shm_all_to_all(c, *m.window, in, out, block);
    const char* src = in;
    std::vector<char> staged;
    if (in == out) {  // messages read the input while others land in the output
      staged.assign(in, in + block * m.size);
      src = staged.data();
    }
    direct_all_to_all(c, src, out, block);
  });
}

Work do_gather(Communicator& comm, const GatherOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_root(m, o.root, "gather");
  check_buffer(o.input, o.count, "gather", "input");
  if (m.rank == o.root) check_buffer(o.output, o.count, "gather", "output on the root");
  size_t block = o.count * dtype_size(o.dtype);
  const char* in = static_cast<const char*>(o.input);
  char* out = static_cast<char*>(o.output);
  auto fp = m.next_fp(OpKind::kGather, o.dtype, ReduceOp::kSum, o.root, o.count);
  return run(comm, fp, o.timeout, async, [&m, in, out, block, o](OpContext& c) {
    if (auto* native = m.transport->native()) return native->gather(c.fp, c.timeout, in, out, block, o.root);
    if (m.window) return shm_gather(c, *m.window, in, out, block, o.root);
    direct_gather(c, in, out, block, o.root);
  });
}

Work do_scatter(Communicator& comm, const ScatterOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  check_root(m, o.root, "scatter");
  check_buffer(o.output, o.count, "scatter", "output");
  if (m.rank == o.root) check_buffer(o.input, o.count, "scatter", "input on the root");
  size_t block = o.count * dtype_size(o.dtype);
  const char* in = static_cast<const char*>(o.input);
  char* out = static_cast<char*>(o.output);
  auto fp = m.next_fp(OpKind::kScatter, o.dtype, ReduceOp::kSum, o.root, o.count);
  return run(comm, fp, o.timeout, async, [&m, in, out, block, o](OpContext& c) {
    if (auto* native = m.transport->native()) return native->scatter(c.fp, c.timeout, in, out, block, o.root);
    if (m.window) return shm_scatter(c, *m.window, in, out, block, o.root);
    direct_scatter(c, in, out, block, o.root);
  });
}

Work do_barrier(Communicator& comm, const BarrierOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  auto fp = m.next_fp(OpKind::kBarrier, DType::kU8, ReduceOp::kSum, -1, 0);
  return run(comm, fp, o.timeout, async, [&m](OpContext& c) {
    if (auto* native = m.transport->native()) return native->barrier(c.fp, c.timeout);
    if (m.window) return shm_barrier(c, *m.window);
    dissemination_barrier(c);
  });
}

Work do_send(Communicator& comm, const SendOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  need(o.peer >= 0 && o.peer < m.size && o.peer != m.rank, "send: peer ", o.peer, " is not another rank of ",
       m.size);
  check_buffer(o.buffer, o.count, "send", "buffer");
  Fingerprint fp{OpKind::kSend, o.dtype, ReduceOp::kSum, static_cast<int32_t>(o.tag), o.count,
                 m.send_seq[o.peer]++};
  const char* buf = static_cast<const char*>(o.buffer);
  size_t bytes = o.count * dtype_size(o.dtype);
  int peer = o.peer;
  return run(comm, fp, o.timeout, async, [buf, bytes, peer](OpContext& c) { c.send(peer, buf, bytes); }, true);
}

Work do_recv(Communicator& comm, const RecvOptions& o, bool async) {
  Impl& m = CommunicatorAccess::impl(comm);
  need(o.peer >= 0 && o.peer < m.size && o.peer != m.rank, "recv: peer ", o.peer, " is not another rank of ",
       m.size);
  check_buffer(o.buffer, o.count, "recv", "buffer");
  Fingerprint fp{OpKind::kRecv, o.dtype, ReduceOp::kSum, static_cast<int32_t>(o.tag), o.count,
                 m.recv_seq[o.peer]++};
  char* buf = static_cast<char*>(o.buffer);
  size_t bytes = o.count * dtype_size(o.dtype);
  int peer = o.peer;
  return run(comm, fp, o.timeout, async, [buf, bytes, peer](OpContext& c) { c.recv(peer, buf, bytes); }, true);
}

}  // namespace

void all_reduce(Communicator& c, const AllReduceOptions& o) { do_all_reduce(c, o, false); }
Work all_reduce_async(Communicator& c, const AllReduceOptions& o) { return do_all_reduce(c, o, true); }
void reduce(Communicator& c, const ReduceOptions& o) { do_reduce(c, o, false); }
Work reduce_async(Communicator& c, const ReduceOptions& o) { return do_reduce(c, o, true); }
void broadcast(Communicator& c, const BroadcastOptions& o) { do_broadcast(c, o, false); }
Work broadcast_async(Communicator& c, const BroadcastOptions& o) { return do_broadcast(c, o, true); }
void all_gather(Communicator& c, const AllGatherOptions& o) { do_all_gather(c, o, false); }
Work all_gather_async(Communicator& c, const AllGatherOptions& o) { return do_all_gather(c, o, true); }
void reduce_scatter(Communicator& c, const ReduceScatterOptions& o) { do_reduce_scatter(c, o, false); }
Work reduce_scatter_async(Communicator& c, const ReduceScatterOptions& o) {
  return do_reduce_scatter(c, o, true);
}
void all_to_all(Communicator& c, const AllToAllOptions& o) { do_all_to_all(c, o, false); }
Work all_to_all_async(Communicator& c, const AllToAllOptions& o) { return do_all_to_all(c, o, true); }
void gather(Communicator& c, const GatherOptions& o) { do_gather(c, o, false); }
Work gather_async(Communicator& c, const GatherOptions& o) { return do_gather(c, o, true); }
void scatter(Communicator& c, const ScatterOptions& o) { do_scatter(c, o, false); }
Work scatter_async(Communicator& c, const ScatterOptions& o) { return do_scatter(c, o, true); }
void barrier(Communicator& c, const BarrierOptions& o) { do_barrier(c, o, false); }
Work barrier_async(Communicator& c, const BarrierOptions& o) { return do_barrier(c, o, true); }
void send(Communicator& c, const SendOptions& o) { do_send(c, o, false); }
Work send_async(Communicator& c, const SendOptions& o) { return do_send(c, o, true); }
void recv(Communicator& c, const RecvOptions& o) { do_recv(c, o, false); }
Work recv_async(Communicator& c, const RecvOptions& o) { return do_recv(c, o, true); }

}  // namespace loom::comm
