// shm-direct algorithms (docs/algorithms.md, "shm-direct"), the shared window's own
// collectives (declared in comm/algorithms/algorithms.h, beside the others, so that the
// algorithms there never include the window): every rank copies its input
// into its own slot of the shared window, publishes the round, and reads what it needs
// straight from its peers' slots. A message is cut into rounds that fit a slot; two
// slots per rank let round k+1 be filled while peers still read round k. An input in
// shared memory (Communicator::alloc_shared) is not copied: the round's post names it and
// peers read it in place (all_reduce, reduce, all_gather, reduce_scatter, broadcast's root;
// ShmWindow::place).
//
// all_reduce of large messages: each rank reduces its 1/n slice of the round across all
// slots (in rank order, so the bits never depend on timing) into its own slot, then
// copies every finished slice out: per rank about 2 reads and 2 writes of the message.
// The slices go to the slots with ordinary or streaming stores, whichever the op's decider
// measures cheaper (ShmWindow::choose_slice_mode). Small messages skip the second phase:
// every rank reduces the whole round itself.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"
#include "comm/transport/shm/shm_window.h"

namespace loom::comm {
namespace {

constexpr size_t kSmallBytes = 16 << 10;  // at or below: every rank reduces every byte
// Outputs at least this large are written with streaming stores (write_out).
constexpr size_t kStreamOutBytes = 32 << 20;

// The last-level cache's size: the largest cache cpu0 has, as sysfs describes it (what lscpu
// shows); glibc's sysconf where sysfs says nothing, and 32 MiB where neither does. sysconf
// alone misleads in a VM: on a Zen 3 guest whose cores share one 32 MiB L3 it reported 256
// MiB, presumably the host socket's eight.
size_t llc_bytes() {
  static const size_t bytes = [] {
    size_t best = 0;
    for (int i = 0; i < 8; ++i) {
      std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
      size_t value = 0;
      char unit = 0;
      if (!(in >> value)) continue;
      in >> unit;
      value <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
      best = std::max(best, value);
    }
    if (best > 0) return best;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? static_cast<size_t>(l3) : size_t{32} << 20;
  }();
  return bytes;
}

// How many of a group's n ranks on this host can run at once: n, or the CPUs this process
// may use where ranks outnumber them (their caches hold only what the running ones touch).
int running_ranks(int n) {
  static const int cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  }();
  return std::min(n, cpus);
}

// Whether an op streams its output past the cache: its output is too large for any cache to
// keep (kStreamOutBytes), or the bytes its running ranks touch at once, inputs and outputs,
// fill half the last-level cache, so the output would evict what the op reads next. Zen 3 (2
// cores, 32 MiB L3; docs/perf.md): all_gather with shared inputs, np=2, busbw at 8 MiB (24 MiB
// touched) 3.3-3.6 GB/s ordinary against 5.9-6.7 streamed, at 4 MiB (12) 11.8-13.6 against
// 6.5-7.4; np=4 on the 2 cores, 4 MiB (12) 6.4-6.7 against 3.4-4.8, 8 MiB (24) 2.2-2.4 against
// 3.5-4.7. A broadcast receiver's copy from the root's shared buffer the same way.
bool streams_output(size_t output_bytes, size_t touched) {
  return output_bytes >= kStreamOutBytes || touched >= llc_bytes() / 2;
}

// How many bytes at the head of each running rank's output an op that streams may still
// write with ordinary stores: what is left of half the last-level cache once its `inputs`
// are in it, shared among the `running` ranks. Those lines stay cached from call to call,
// and for whoever reads the output next; the rest streams. Zen 3, np=2 all_gather with
// shared inputs, busbw GB/s streaming everything -> with the head, two alternated runs: 6 MiB
// 5.1-5.3 -> 7.0-9.1, 8 MiB 5.1-5.3 -> 6.6-8.0; a head from three quarters of the cache lost
// at 12-16 MiB (4.5-4.7 -> 4.1-4.2).
size_t cached_head(size_t inputs, int running) {
  const size_t half = llc_bytes() / 2;
  return half > inputs ? (half - inputs) / running : 0;
}

// Copies into an op's output. An output that would be evicted before anyone reads it is
// better streamed straight to memory (`stream`), since ordinary stores first read every
// line for ownership: np=2 all_gather at 64 MiB went from 3.7-4.1 to 4.6-5.1 GB/s busbw
// (docs/perf.md). A broadcast receiver copying from the root's slot does not stream: it
// copies while the slot is still cached, and streaming measured 5% slower at 64 and 256 MiB
// and 30% slower at 8-16 MiB.
void write_out(bool stream, void* dst, const void* src, size_t n) {
  if (stream) {
    stream_copy(dst, src, n);
  } else {
    copy_bytes(dst, src, n);
  }
}

// Starts a round in which this rank's data() holds `bytes` (0: none). A
// rank that will post in it (write its slot or post line) first waits until every rank
// is done with the rounds that last used them; one that only reads need not (broadcast
// and scatter receivers), since kDone counts every round up to it.
uint64_t begin_round(OpContext& c, ShmWindow& w, size_t bytes, bool posts = true) {
  uint64_t round = w.next_round();
  if (posts) w.wait_slot_free(round, bytes, c.t, c.fp, c.timeout);
  return round;
}

// One pointer per rank for reduce_many, on the stack for groups up to kOnStack: a heap
// allocation would cost a small op a tenth of its time.
class PeerPtrs {
 public:
  explicit PeerPtrs(int n) {
    if (n > kOnStack) heap_.resize(static_cast<size_t>(n));
  }
  const void*& operator[](int i) { return heap_.empty() ? stack_[i] : heap_[static_cast<size_t>(i)]; }
  const void** data() { return heap_.empty() ? stack_ : heap_.data(); }

 private:
  static constexpr int kOnStack = 16;
  const void* stack_[kOnStack];
  std::vector<const void*> heap_;
};

template <typename Body>
void for_rounds(size_t total, size_t per_round, Body body) {
  if (total == 0) {
    body(size_t{0}, size_t{0});  // zero-sized ops still meet, so mismatches are caught
    return;
  }
  for (size_t off = 0; off < total; off += per_round) body(off, std::min(per_round, total - off));
}

void reduce_rounds(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count, DType dt,
                   ReduceOp op, int root) {
  const int n = w.size(), me = w.rank();
  const size_t es = dtype_size(dt);
  const bool small = count * es <= kSmallBytes;
  PeerPtrs ins(n);
  uint64_t placed = 0;  // the last round whose input peers read in place
  for_rounds(count, w.slot_bytes() / es, [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, m * es);
    char* mine = w.slot(me, round);
    const char* src = in + off * es;
    if (small) {
      w.fill(w.data(me, round, m * es), src, m * es);
      w.publish(ShmWindow::kPosted, round, &c.fp);
      w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
      if (root < 0 || root == me) {
        for (int p = 0; p < n; ++p) ins[p] = p == me ? src : w.data(p, round, m * es);
        reduce_many(out + off * es, ins.data(), n, m, dt, op);
      }
      w.publish(ShmWindow::kDone, round);
      return;
    }
    // Peers need every slice but this rank's own, which it reduces from its input.
    const size_t b0 = block_begin(m, n, me), b1 = block_begin(m, n, me + 1);
    if (w.place(round, src, m * es)) {
      placed = round;
    } else {
      w.fill(mine, src, b0 * es);
      w.fill(mine + b1 * es, src + b1 * es, (m - b1) * es);
    }
    // A rank that copies every slice out picks how all of them are stored this round.
    const int decider = root < 0 ? 0 : root;
    if (me == decider) w.post_slice_mode(round, w.choose_slice_mode());
    w.publish(ShmWindow::kPosted, round, &c.fp);
    w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
    const Clock::time_point t0 = me == decider ? Clock::now() : Clock::time_point{};  // the decider times its round
    const int slice_mode = w.slice_mode(decider, round);
    for (int p = 0; p < n; ++p) ins[p] = (p == me ? src : w.input(p, round, m * es)) + b0 * es;
    const bool gathers = root < 0 || root == me;
    // The finished slice goes to the slot (for peers) and, on ranks that want the
    // result, straight to the output.
    reduce_many(mine + b0 * es, ins.data(), n, b1 - b0, dt, op, gathers ? out + (off + b0) * es : nullptr,
                slice_mode == 1);
    w.publish(ShmWindow::kReduced, round);
    if (gathers) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        w.wait(p, ShmWindow::kReduced, round, c.t, c.fp, c.timeout);
        size_t p0 = block_begin(m, n, p), p1 = block_begin(m, n, p + 1);
        write_out(count * es >= kStreamOutBytes, out + (off + p0) * es, w.slot(p, round) + p0 * es, (p1 - p0) * es);
      }
    }
    if (me == decider) {
      const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      w.note_slice_cost(slice_mode, ns / static_cast<double>(m * es));
    }
    w.publish(ShmWindow::kDone, round);
  });
  // Peers read this rank's input in place: it is the caller's again once they are done.
  if (placed) w.wait_all(ShmWindow::kDone, placed, c.t, c.fp, c.timeout);
}

}  // namespace

void shm_all_reduce(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count, DType dt,
                    ReduceOp op) {
  reduce_rounds(c, w, in, out, count, dt, op, -1);
}

void shm_reduce(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count, DType dt,
                ReduceOp op, int root) {
  reduce_rounds(c, w, in, out, count, dt, op, root);
}

void shm_reduce_scatter(OpContext& c, ShmWindow& w, const char* in, char* out, size_t count,
                        DType dt, ReduceOp op) {
  const int n = w.size(), me = w.rank();
  const size_t es = dtype_size(dt);
  PeerPtrs ins(n);
  const size_t per_round = std::max<size_t>(w.slot_bytes() / es / n, 1);
  const size_t whole = n * count * es;  // the input, placed whole when it is placed
  uint64_t placed = 0;                  // the last round whose input peers read in place
  for_rounds(count, per_round, [&](size_t off, size_t m) {
    const size_t bytes = n * m * es;
    uint64_t round = begin_round(c, w, bytes);
    char* mine = w.data(me, round, bytes);
    if (bytes > ShmWindow::kInlineBytes && w.place(round, in, whole)) {
      placed = round;
    } else {
      for (int p = 0; p < n; ++p) w.fill(mine + p * m * es, in + (p * count + off) * es, m * es);
    }
    w.publish(ShmWindow::kPosted, round, &c.fp);
    w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
    for (int p = 0; p < n; ++p) {
      const char* theirs = bytes > ShmWindow::kInlineBytes ? w.placed(p, round, whole) : nullptr;
      ins[p] = theirs ? theirs + (me * count + off) * es : w.data(p, round, bytes) + me * m * es;
    }
    reduce_many(out + off * es, ins.data(), n, m, dt, op);
    w.publish(ShmWindow::kDone, round);
  });
  if (placed) w.wait_all(ShmWindow::kDone, placed, c.t, c.fp, c.timeout);
}

void shm_all_gather(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes) {
  const int n = w.size(), me = w.rank();
  const size_t total = block_bytes * n;
  // The running ranks' outputs and every rank's input.
  const bool stream = streams_output(total, (running_ranks(n) + 1) * total);
  // Of a streamed output under kStreamOutBytes, the head that still fits stays cached.
  const size_t head = stream && total < kStreamOutBytes ? cached_head(total, running_ranks(n)) : 0;
  auto put = [&](char* dst, const char* src, size_t m) {
    const size_t at = dst - out;
    const size_t cached = at >= head ? 0 : std::min(m, head - at);
    if (cached > 0) copy_bytes(dst, src, cached);
    if (m > cached) write_out(stream, dst + cached, src + cached, m - cached);
  };
  uint64_t placed = 0;  // the last round whose input peers read in place
  for_rounds(block_bytes, w.slot_bytes(), [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, m);
    char* own = out + me * block_bytes + off;
    const bool in_place = w.place(round, in + off, m);
    // Unless peers read it in place, this rank's own part goes to its slot and its output
    // in one pass (the latter unless the op is in place), streamed whole if the op streams.
    if (!in_place) w.fill(w.data(me, round, m), in + off, m, own != in + off ? own : nullptr, stream);
    w.publish(ShmWindow::kPosted, round, &c.fp);
    if (in_place) {
      placed = round;
      if (own != in + off) put(own, in + off, m);
    }
    w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
    for (int p = 0; p < n; ++p) {
      if (p != me) put(out + p * block_bytes + off, w.input(p, round, m), m);
    }
    w.publish(ShmWindow::kDone, round);
  });
  if (placed) w.wait_all(ShmWindow::kDone, placed, c.t, c.fp, c.timeout);
}

// A root whose buffer is shared is read in place and waits for its receivers; any other
// fills its slot and returns, and may fill the next call's round while they copy. Receivers
// of a buffer read in place stream their copies as streams_output says (the root's buffer
// and the running receivers' outputs): np=2 on Zen 3, 8-64 MiB, 5.2-9.2 -> 7.2-13.7 GB/s.
void shm_broadcast(OpContext& c, ShmWindow& w, char* buf, size_t bytes, int root) {
  const int me = w.rank();
  const bool stream_placed = streams_output(bytes, running_ranks(w.size()) * bytes);
  uint64_t placed = 0;  // the root's last round that receivers read in place
  for_rounds(bytes, w.slot_bytes(), [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, m, me == root);
    if (me == root) {
      if (w.place(round, buf + off, m)) placed = round;
      else w.fill(w.data(me, round, m), buf + off, m);
      w.publish(ShmWindow::kPosted, round, &c.fp);
    } else {
      w.wait(root, ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
      const char* in_place = m > ShmWindow::kInlineBytes ? w.placed(root, round, m) : nullptr;  // as input()
      write_out(in_place != nullptr && stream_placed, buf + off, in_place ? in_place : w.data(root, round, m), m);
    }
    w.publish(ShmWindow::kDone, round);
  });
  if (placed) w.wait_all(ShmWindow::kDone, placed, c.t, c.fp, c.timeout);
}

void shm_gather(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes, int root) {
  const int n = w.size(), me = w.rank();
  for_rounds(block_bytes, w.slot_bytes(), [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, m);
    if (me != root) {
      w.fill(w.data(me, round, m), in + off, m);
      w.publish(ShmWindow::kPosted, round, &c.fp);
      w.wait(root, ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
    } else {
      w.publish(ShmWindow::kPosted, round, &c.fp);
      w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
      for (int p = 0; p < n; ++p) {
        const char* src = p == me ? in + off : w.data(p, round, m);
        char* dst = out + p * block_bytes + off;
        if (dst != src) write_out(n * block_bytes >= kStreamOutBytes, dst, src, m);
      }
    }
    w.publish(ShmWindow::kDone, round);
  });
}

void shm_scatter(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes, int root) {
  const int n = w.size(), me = w.rank();
  const size_t per_round = std::max<size_t>(w.slot_bytes() / n, 1);
  for_rounds(block_bytes, per_round, [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, n * m, me == root);
    if (me == root) {
      char* mine = w.data(me, round, n * m);
      for (int p = 0; p < n; ++p) w.fill(mine + p * m, in + p * block_bytes + off, m);
      w.publish(ShmWindow::kPosted, round, &c.fp);
      write_out(block_bytes >= kStreamOutBytes, out + off, in + me * block_bytes + off, m);
    } else {
      w.wait(root, ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
      write_out(block_bytes >= kStreamOutBytes, out + off, w.data(root, round, n * m) + me * m, m);
    }
    w.publish(ShmWindow::kDone, round);
  });
}

void shm_all_to_all(OpContext& c, ShmWindow& w, const char* in, char* out, size_t block_bytes) {
  const int n = w.size(), me = w.rank();
  const size_t per_round = std::max<size_t>(w.slot_bytes() / n, 1);
  for_rounds(block_bytes, per_round, [&](size_t off, size_t m) {
    uint64_t round = begin_round(c, w, n * m);
    char* mine = w.data(me, round, n * m);
    for (int p = 0; p < n; ++p) w.fill(mine + p * m, in + p * block_bytes + off, m);
    w.publish(ShmWindow::kPosted, round, &c.fp);
    w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
    for (int p = 0; p < n; ++p) {
      const char* src = p == me ? in + me * block_bytes + off : w.data(p, round, n * m) + me * m;
      write_out(n * block_bytes >= kStreamOutBytes, out + p * block_bytes + off, src, m);
    }
    w.publish(ShmWindow::kDone, round);
  });
}

void shm_barrier(OpContext& c, ShmWindow& w) {
  uint64_t round = begin_round(c, w, 0);
  w.publish(ShmWindow::kPosted, round, &c.fp);
  w.wait_all(ShmWindow::kPosted, round, c.t, c.fp, c.timeout);
  w.publish(ShmWindow::kDone, round);
}

}  // namespace loom::comm
