// hierarchical (docs/algorithms.md, "hierarchical"): for groups that span hosts. Each
// host reduces to one representative through its shared window (or tree over loopback
// when shm is off), representatives combine across hosts with ring or tree, and each
// representative broadcasts the result to its host. Only one rank per host sends each
// byte across hosts, instead of every rank.
//
// avg is summed in both stages and divided by the whole group's size once, at the end,
// so results match the closed form whatever the host sizes.
#include <algorithm>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"
#include "comm/transport/group_view.h"

namespace loom::comm {
namespace {

constexpr size_t kCrossTreeMaxBytes = 64 << 10;  // cross-host: recursive doubling at or below

int index_of(const std::vector<int>& v, int x) {
  return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
}

// Who speaks for each host: `root` on its own host, else the host's lowest rank.
struct Plan {
  std::vector<int> reps;  // one per host, in host order
  int local_rep = 0;      // index of this host's representative among its ranks
  bool is_rep = false;
};

Plan plan_for(const Topology& topo, int me, int root) {
  Plan p;
  for (const auto& h : topo.hosts) p.reps.push_back(index_of(h, root) < static_cast<int>(h.size()) ? root : h[0]);
  const auto& mine = topo.hosts[topo.host];
  p.local_rep = index_of(mine, p.reps[topo.host]);
  p.is_rep = p.reps[topo.host] == me;
  return p;
}

OpContext view_context(OpContext& c, GroupView& v) { return {v, c.fp, c.timeout, c.scratch, c.chunk_bytes}; }

// Sums (or mins, ...) this host's inputs into `out` on the host's representative.
void local_reduce(OpContext& c, const Topology& topo, const Plan& p, const char* in, char* out,
                  size_t count, DType dt, ReduceOp op) {
  const auto& mine = topo.hosts[topo.host];
  if (mine.size() == 1) return copy_bytes(out, in, count * dtype_size(dt));
  if (topo.window) return shm_reduce(c, *topo.window, in, out, count, dt, op, p.local_rep);
  GroupView local(c.t, mine);
  OpContext lc = view_context(c, local);
  tree_reduce(lc, in, out, count, dt, op, p.local_rep);
}

void local_broadcast(OpContext& c, const Topology& topo, const Plan& p, char* buf, size_t bytes) {
  const auto& mine = topo.hosts[topo.host];
  if (mine.size() == 1) return;
  if (topo.window) return shm_broadcast(c, *topo.window, buf, bytes, p.local_rep);
  GroupView local(c.t, mine);
  OpContext lc = view_context(c, local);
  tree_broadcast(lc, buf, bytes, p.local_rep);
}

ReduceOp stage_op(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace

void hier_all_reduce(OpContext& c, const Topology& topo, const char* in, char* out, size_t count,
                     DType dt, ReduceOp op) {
  const Plan p = plan_for(topo, c.rank(), topo.hosts[0][0]);
  const size_t bytes = count * dtype_size(dt);
  local_reduce(c, topo, p, in, out, count, dt, stage_op(op));
  if (p.is_rep && p.reps.size() > 1) {
    GroupView cross(c.t, p.reps);
    OpContext xc = view_context(c, cross);
    if (bytes <= kCrossTreeMaxBytes)
      tree_all_reduce(xc, out, out, count, dt, stage_op(op));
    else
      ring_all_reduce(xc, out, out, count, dt, stage_op(op));
  }
  if (p.is_rep && op == ReduceOp::kAvg) finish_avg(out, count, dt, c.size());
  local_broadcast(c, topo, p, out, bytes);
}

void hier_reduce(OpContext& c, const Topology& topo, const char* in, char* out, size_t count,
                 DType dt, ReduceOp op, int root) {
  const Plan p = plan_for(topo, c.rank(), root);
  const bool am_root = c.rank() == root;
  std::vector<char> partial(p.is_rep && !am_root ? count * dtype_size(dt) : 0);
  char* acc = am_root ? out : partial.data();
  local_reduce(c, topo, p, in, acc, count, dt, stage_op(op));
  if (p.is_rep && p.reps.size() > 1) {
    GroupView cross(c.t, p.reps);
    OpContext xc = view_context(c, cross);
    tree_reduce(xc, acc, acc, count, dt, stage_op(op), index_of(p.reps, root));
  }
  if (am_root && op == ReduceOp::kAvg) finish_avg(out, count, dt, c.size());
}

void hier_broadcast(OpContext& c, const Topology& topo, char* buf, size_t bytes, int root) {
  const Plan p = plan_for(topo, c.rank(), root);
  if (p.is_rep && p.reps.size() > 1) {
    GroupView cross(c.t, p.reps);
    OpContext xc = view_context(c, cross);
    tree_broadcast(xc, buf, bytes, index_of(p.reps, root));
  }
  local_broadcast(c, topo, p, buf, bytes);
}

}  // namespace loom::comm
