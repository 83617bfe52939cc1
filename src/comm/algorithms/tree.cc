// Latency-optimal algorithms (docs/algorithms.md, "tree"): recursive doubling for
// all_reduce, binomial trees for broadcast and reduce, a dissemination barrier.
// Contributions are always combined lower rank first, so every rank ends with the same
// bits.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace loom::comm {
namespace {

int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// acc = (lower's value) op (higher's value), whichever of acc / other came from the
// lower rank.
void combine_ordered(char* acc, char* other, bool acc_is_lower, size_t count, DType dt,
                     ReduceOp op) {
  if (acc_is_lower) {
    reduce_into(acc, other, count, dt, op);
  } else {
    reduce_into(other, acc, count, dt, op);
    copy_bytes(acc, other, count * dtype_size(dt));
  }
}

}  // namespace

void tree_all_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(dt);
  if (in != out) copy_bytes(out, in, bytes);
  if (n > 1 && count > 0) {
    char* tmp = c.workspace(bytes);
    // Fold the ranks beyond the largest power of two into their even neighbours.
    const int p2 = floor_pow2(n), extra = n - p2;
    int vr;  // rank among the p2 participants, or -1 for a folded rank
    if (r < 2 * extra) {
      if (r % 2 == 0) {
        c.send(r + 1, out, bytes);
        c.wait();
        vr = -1;
      } else {
        c.recv(r - 1, tmp, bytes);
        c.wait();
        combine_ordered(out, tmp, false, count, dt, op);
        vr = r / 2;
      }
    } else {
      vr = r - extra;
    }
    auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    if (vr >= 0) {
      for (int mask = 1; mask < p2; mask <<= 1) {
        int partner = real(vr ^ mask);
        c.send(partner, out, bytes);
        c.recv(partner, tmp, bytes);
        c.wait();
        combine_ordered(out, tmp, r < partner, count, dt, op);
      }
    }
    if (r < 2 * extra) {
      if (r % 2 == 0)
        c.recv(r + 1, out, bytes);
      else
        c.send(r - 1, out, bytes);
      c.wait();
    }
  }
  if (op == ReduceOp::kAvg) finish_avg(out, count, dt, n);
}

void tree_broadcast(OpContext& c, char* buf, size_t bytes, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  if (n == 1) return;
  // Chunks flow down the tree one after another, so deep trees pipeline.
  const size_t chunk = std::max<size_t>(c.chunk_bytes, 1);
  int parent = -1;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      parent = (vr - mask + root) % n;
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) children.push_back((vr + mask + root) % n);
  size_t steps = std::max<size_t>((bytes + chunk - 1) / chunk, 1);
  for (size_t k = 0; k < steps; ++k) {
    size_t o = k * chunk, m = std::min(chunk, bytes - o);
    if (parent >= 0) {
      c.recv(parent, buf + o, m);
      c.wait();
    }
    for (int ch : children) c.send(ch, buf + o, m);
    c.wait();
  }
}

void tree_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op,
                 int root) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(dt);
  // Non-roots accumulate in the workspace; the root in its output.
  char* ws = c.workspace(2 * bytes);
  char* acc = r == root ? out : ws;
  char* tmp = ws + bytes;
  if (acc != in) copy_bytes(acc, in, bytes);
  const int vr = (r - root + n) % n;
  for (int mask = 1; mask < n && count > 0; mask <<= 1) {
    if (vr & mask) {
      c.send((vr - mask + root) % n, acc, bytes);
      c.wait();
      break;
    }
    if (vr + mask < n) {
      c.recv((vr + mask + root) % n, tmp, bytes);
      c.wait();
      reduce_into(acc, tmp, count, dt, op);  // the lower virtual rank's value comes first
    }
  }
  if (r == root && op == ReduceOp::kAvg) finish_avg(out, count, dt, n);
}

void dissemination_barrier(OpContext& c) {
  const int n = c.size(), r = c.rank();
  char token = 0, got = 0;
  for (int k = 1; k < n; k <<= 1) {
    c.send((r + k) % n, &token, 0);
    c.recv((r - k + n) % n, &got, 0);
    c.wait();
  }
}

void direct_all_to_all(OpContext& c, const char* in, char* out, size_t block_bytes) {
  const int n = c.size(), r = c.rank();
  if (in != out) {
    copy_bytes(out + r * block_bytes, in + r * block_bytes, block_bytes);
  } else {
    LOOM_CHECK(in != out);  // in-place all_to_all is staged by the caller
  }
  // Pairwise order (r+k, r-k) spreads the load instead of everyone hitting rank 0 first.
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n, from = (r - k + n) % n;
    c.send(to, in + to * block_bytes, block_bytes);
    c.recv(from, out + from * block_bytes, block_bytes);
  }
  c.wait();
}

void direct_gather(OpContext& c, const char* in, char* out, size_t block_bytes, int root) {
  const int n = c.size(), r = c.rank();
  if (r != root) {
    c.send(root, in, block_bytes);
  } else {
    if (in != out + r * block_bytes) copy_bytes(out + r * block_bytes, in, block_bytes);
    for (int p = 0; p < n; ++p)
      if (p != r) c.recv(p, out + p * block_bytes, block_bytes);
  }
  c.wait();
}

void direct_scatter(OpContext& c, const char* in, char* out, size_t block_bytes, int root) {
  const int n = c.size(), r = c.rank();
  if (r != root) {
    c.recv(root, out, block_bytes);
  } else {
    if (out != in + r * block_bytes) copy_bytes(out, in + r * block_bytes, block_bytes);
    for (int p = 0; p < n; ++p)
      if (p != r) c.send(p, in + p * block_bytes, block_bytes);
  }
  c.wait();
}

}  // namespace loom::comm
