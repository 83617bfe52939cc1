// Ring algorithms (docs/algorithms.md, "ring"). The vector is cut into n blocks; in step
// s of the reduce-scatter phase rank r sends block (r-s-1) mod n to rank r+1 and adds
// the block it receives from rank r-1 to its own, so after n-1 steps it holds block r
// reduced over all ranks. The all-gather phase passes finished blocks around the ring.
// Each block is sent in chunks of c.chunk_bytes so sends, receives and reductions
// overlap through the transport's buffers.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace loom::comm {

char* OpContext::workspace(size_t n) {
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Reduce-scatter core. `block(b)` gives the bytes of this rank's contribution to block b;
// the finished block r lands in `result`. Partial sums travel in two rotating buffers.
template <typename BlockPtr>
void reduce_scatter_ring(OpContext& c, BlockPtr block, const size_t* begin, char* result, DType dt,
                         ReduceOp op) {
  const int n = c.size(), r = c.rank();
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const size_t es = dtype_size(dt);
  size_t max_block = 0;
  for (int b = 0; b < n; ++b) max_block = std::max(max_block, begin[b + 1] - begin[b]);
  char* ws = c.workspace(2 * max_block * es);
  char* bufs[2] = {ws, ws + max_block * es};
  const size_t chunk = std::max<size_t>(c.chunk_bytes / es, 1);
  for (int s = 0; s < n - 1; ++s) {
    const int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
    const char* send_base = s == 0 ? block(sb) : bufs[(s - 1) & 1];
    char* recv_base = bufs[s & 1];
    const bool last = s == n - 2;
    const size_t send_count = begin[sb + 1] - begin[sb], recv_count = begin[rb + 1] - begin[rb];
    const size_t steps = std::max((send_count + chunk - 1) / chunk, (recv_count + chunk - 1) / chunk);
    for (size_t k = 0; k < steps; ++k) {
      size_t so = k * chunk, ro = k * chunk;
      if (so < send_count) c.send(right, send_base + so * es, std::min(chunk, send_count - so) * es);
      size_t rn = ro < recv_count ? std::min(chunk, recv_count - ro) : 0;
      if (rn) c.recv(left, recv_base + ro * es, rn * es);
      c.wait();
      if (!rn) continue;
      reduce_into(recv_base + ro * es, block(rb) + ro * es, rn, dt, op);
      // The result may alias this rank's input block, so it is written only after the
      // reduction above has read that chunk.
      if (last) copy_bytes(result + ro * es, recv_base + ro * es, rn * es);
    }
  }
}

void all_gather_ring(OpContext& c, char* out, const size_t* begin, size_t es) {
  const int n = c.size(), r = c.rank();
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const size_t chunk = std::max<size_t>(c.chunk_bytes / es, 1);
  for (int s = 0; s < n - 1; ++s) {
    const int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    const size_t send_count = begin[sb + 1] - begin[sb], recv_count = begin[rb + 1] - begin[rb];
    const size_t steps = std::max((send_count + chunk - 1) / chunk, (recv_count + chunk - 1) / chunk);
    for (size_t k = 0; k < steps; ++k) {
      size_t o = k * chunk;
      if (o < send_count) c.send(right, out + (begin[sb] + o) * es, std::min(chunk, send_count - o) * es);
      if (o < recv_count) c.recv(left, out + (begin[rb] + o) * es, std::min(chunk, recv_count - o) * es);
      c.wait();
    }
  }
}

std::vector<size_t> even_blocks(size_t count, int n) {
  std::vector<size_t> b(n + 1);
  for (int i = 0; i <= n; ++i) b[i] = block_begin(count, n, i);
  return b;
}

}  // namespace

void ring_all_reduce(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtype_size(dt);
  if (in != out) copy_bytes(out, in, count * es);
  if (n == 1 || count == 0) {
    if (op == ReduceOp::kAvg) finish_avg(out, count, dt, n);
    return;
  }
  auto begin = even_blocks(count, n);
  reduce_scatter_ring(c, [&](int b) -> const char* { return out + begin[b] * es; }, begin.data(),
                      out + begin[r] * es, dt, op);
  if (op == ReduceOp::kAvg) finish_avg(out + begin[r] * es, begin[r + 1] - begin[r], dt, n);
  all_gather_ring(c, out, begin.data(), es);
}

void ring_reduce_scatter(OpContext& c, const char* in, char* out, size_t count, DType dt, ReduceOp op) {
  const int n = c.size();
  const size_t es = dtype_size(dt);
  if (n == 1) {
    if (in != out) copy_bytes(out, in, count * es);
    if (op == ReduceOp::kAvg) finish_avg(out, count, dt, n);
    return;
  }
  if (count == 0) return;
  std::vector<size_t> begin(n + 1);
  for (int b = 0; b <= n; ++b) begin[b] = count * static_cast<size_t>(b);
  reduce_scatter_ring(c, [&](int b) -> const char* { return in + begin[b] * es; }, begin.data(),
                      out, dt, op);
  if (op == ReduceOp::kAvg) finish_avg(out, count, dt, n);
}

void ring_all_gather(OpContext& c, const char* in, char* out, size_t count, DType dt) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtype_size(dt);
  if (in != out + r * count * es) copy_bytes(out + r * count * es, in, count * es);
  if (n == 1 || count == 0) return;
  std::vector<size_t> begin(n + 1);
  for (int b = 0; b <= n; ++b) begin[b] = count * static_cast<size_t>(b);
  all_gather_ring(c, out, begin.data(), es);
}

}  // namespace loom::comm
