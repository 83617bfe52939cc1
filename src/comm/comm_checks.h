// The closed-form collective checks, shared by the thread suite (collectives_test) and
// the process suite (comm_sweep, run under `loom launch`, inside network namespaces and
// under mpirun), so every path runs the same cases.
#pragma once

#include <gtest/gtest.h>

#include <span>

#include "comm/comm_testing.h"

namespace loom::comm::testing {

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                             DType::kI32, DType::kI64, DType::kU8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProd};

inline std::vector<size_t> counts_for(int n) { return {0, 1, 7, static_cast<size_t>(3 * n + 1), 1000}; }

// Fills rank r's element i of a buffer of `count` (offset by `base` in value()).
// value() and expected() repeat every kPeriod elements (lcm of the 7, 11 and 3 in them),
// so big buffers are one period computed, then copied.
constexpr size_t kPeriod = 231;

inline std::vector<char> make(DType dt, ReduceOp op, int r, size_t count, size_t base = 0) {
  const size_t es = dtype_size(dt);
  std::vector<char> b(count * es + 1);
  for (size_t i = 0; i < std::min(count, kPeriod); ++i) store(dt, b.data(), i, value(op, r, base + i));
  for (size_t i = kPeriod; i < count; i += kPeriod)
    std::memcpy(b.data() + i * es, b.data(), std::min(kPeriod, count - i) * es);
  return b;
}

// expected() for every element index, from one period.
struct Expected {
  Expected(ReduceOp op, DType dt, int n) {
    for (size_t i = 0; i < kPeriod; ++i) table[i] = expected(op, dt, n, i);
  }
  double operator()(size_t i) const { return table[i % kPeriod]; }
  double table[kPeriod];
};

#define EXPECT_ELEM(dt, buf, i, want, what)                                                  \
  do {                                                                                       \
    double got_ = load(dt, buf, i);                                                          \
    if (got_ != (want)) {                                                                    \
      ADD_FAILURE() << what << " " << dtype_name(dt) << " element " << i << ": got " << got_ \
                    << ", want " << (want);                                                  \
      return;                                                                                \
    }                                                                                        \
  } while (0)

inline void check_all_reduce(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count, bool in_place) {
  auto in = make(dt, op, c.rank(), count);
  std::vector<char> out(in.size());
  if (in_place) out = in;
  all_reduce(c, {.input = in_place ? nullptr : in.data(), .output = out.data(), .count = count,
                 .dtype = dt, .op = op, .algorithm = a});
  const Expected want(op, dt, c.size());
  for (size_t i = 0; i < count; ++i)
    EXPECT_ELEM(dt, out.data(), i, want(i), "all_reduce " << reduce_op_name(op));
}

inline void check_reduce_scatter(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count) {
  const int n = c.size();
  auto in = make(dt, op, c.rank(), count * n);
  std::vector<char> out(count * dtype_size(dt) + 1);
  reduce_scatter(c, {.input = in.data(), .output = out.data(), .count = count, .dtype = dt, .op = op,
                     .algorithm = a == Algorithm::kTree ? Algorithm::kRing : a});
  const Expected want(op, dt, n);
  for (size_t i = 0; i < count; ++i)
    EXPECT_ELEM(dt, out.data(), i, want(c.rank() * count + i), "reduce_scatter");
}

inline void check_reduce(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count, int root) {
  auto in = make(dt, op, c.rank(), count);
  std::vector<char> out(in.size());
  reduce(c, {.input = in.data(), .output = out.data(), .count = count, .dtype = dt, .op = op,
             .root = root, .algorithm = a == Algorithm::kRing ? Algorithm::kTree : a});
  if (c.rank() != root) return;
  const Expected want(op, dt, c.size());
  for (size_t i = 0; i < count; ++i) EXPECT_ELEM(dt, out.data(), i, want(i), "reduce");
}

inline void check_moves(Communicator& c, Algorithm a, DType dt, size_t count) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtype_size(dt);
  const ReduceOp tag = ReduceOp::kSum;  // value() pattern for data movement
  // broadcast from every root in turn
  for (int root = 0; root < n; root += std::max(1, n / 3)) {
    auto buf = r == root ? make(dt, tag, root, count) : std::vector<char>(count * es + 1);
    broadcast(c, {.buffer = buf.data(), .count = count, .dtype = dt, .root = root,
                  .algorithm = a == Algorithm::kRing ? Algorithm::kTree : a});
    auto want = make(dt, tag, root, count);
    for (size_t i = 0; i < count; ++i) EXPECT_ELEM(dt, buf.data(), i, load(dt, want.data(), i), "broadcast");
  }
  // all_gather, out of place and in place
  for (bool in_place : {false, true}) {
    auto mine = make(dt, tag, r, count);
    std::vector<char> out(n * count * es + 1);
    if (in_place) std::memcpy(out.data() + r * count * es, mine.data(), count * es);
    all_gather(c, {.input = in_place ? nullptr : mine.data(), .output = out.data(), .count = count,
                   .dtype = dt, .algorithm = a == Algorithm::kTree ? Algorithm::kRing : a});
    for (int p = 0; p < n; ++p) {
      auto want = make(dt, tag, p, count);
      for (size_t i = 0; i < count; ++i)
        EXPECT_ELEM(dt, out.data() + p * count * es, i, load(dt, want.data(), i), "all_gather");
    }
  }
  // all_to_all: block j of rank r carries value(r, j*count + i)
  {
    auto in = make(dt, tag, r, n * count);
    std::vector<char> out(n * count * es + 1);
    all_to_all(c, {.input = in.data(), .output = out.data(), .count = count, .dtype = dt});
    for (int p = 0; p < n; ++p) {
      auto theirs = make(dt, tag, p, n * count);
      for (size_t i = 0; i < count; ++i)
        EXPECT_ELEM(dt, out.data() + p * count * es, i, load(dt, theirs.data(), r * count + i), "all_to_all");
    }
  }
  // gather to and scatter from the last rank
  {
    int root = n - 1;
    auto mine = make(dt, tag, r, count);
    std::vector<char> out(n * count * es + 1);
    gather(c, {.input = mine.data(), .output = out.data(), .count = count, .dtype = dt, .root = root});
    if (r == root)
      for (int p = 0; p < n; ++p) {
        auto want = make(dt, tag, p, count);
        for (size_t i = 0; i < count; ++i)
          EXPECT_ELEM(dt, out.data() + p * count * es, i, load(dt, want.data(), i), "gather");
      }
    auto all = make(dt, tag, 100, n * count);
    std::vector<char> part(count * es + 1);
    scatter(c, {.input = r == root ? all.data() : nullptr, .output = part.data(), .count = count, .dtype = dt, .root = root});
    for (size_t i = 0; i < count; ++i) EXPECT_ELEM(dt, part.data(), i, load(dt, all.data(), r * count + i), "scatter");
  }
  // send/recv around the ring, async so every rank can send before it receives
  if (n > 1) {
    auto mine = make(dt, tag, r, count);
    std::vector<char> got(count * es + 1);
    Work s = send_async(c, {.buffer = mine.data(), .count = count, .dtype = dt, .peer = (r + 1) % n, .tag = 7});
    Work w = recv_async(c, {.buffer = got.data(), .count = count, .dtype = dt, .peer = (r + n - 1) % n, .tag = 7});
    s.wait();
    w.wait();
    auto theirs = make(dt, tag, (r + n - 1) % n, count);
    for (size_t i = 0; i < count; ++i) EXPECT_ELEM(dt, got.data(), i, load(dt, theirs.data(), i), "send/recv");
  }
  barrier(c);
}

// Every collective x dtype x op x counts {0, 1, 7, 3n+1, 1000}, then a prime count far
// above the slot and chunk sizes, so rounds and chunks are uneven.
inline void sweep(Communicator& c, Algorithm a) {
  const int n = c.size();
  for (DType dt : kDTypes) {
    for (size_t count : counts_for(n)) {
      for (ReduceOp op : kOps) {
        check_all_reduce(c, a, dt, op, count, false);
        check_reduce_scatter(c, a, dt, op, count);
      }
      check_all_reduce(c, a, dt, ReduceOp::kSum, count, true);
      check_reduce(c, a, dt, ReduceOp::kSum, count, n - 1);
      check_reduce(c, a, dt, ReduceOp::kMax, count, 0);
      check_moves(c, a, dt, count);
    }
  }
  // The prime count, far above the slot and chunk sizes, so rounds and chunks are uneven.
  // Every type at up to 4 ranks; past that, one type of each width: how a count splits into
  // parts, rounds and chunks depends on the element's bytes, not its type, and each type's
  // arithmetic on long buffers is checked at the smaller sizes (five to eight ranks are most
  // of this sweep's time, and their verification grows with the rank count).
  constexpr size_t kPrime = 1000003;
  constexpr DType kWidths[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kU8};
  for (DType dt : n <= 4 ? std::span<const DType>(kDTypes) : std::span<const DType>(kWidths)) {
    for (ReduceOp op : kOps) {
      check_all_reduce(c, a, dt, op, kPrime, false);
      check_reduce_scatter(c, a, dt, op, kPrime / n);
    }
    check_all_reduce(c, a, dt, ReduceOp::kAvg, kPrime, true);
    check_reduce(c, a, dt, ReduceOp::kSum, kPrime, n - 1);
    check_moves(c, a, dt, kPrime / n);
  }
}

// The large case: 16M f32 through every collective.
inline void large_16m(Communicator& c, Algorithm a) {
  constexpr size_t kCount = 16u << 20;
  const size_t n = c.size(), r = c.rank();
  const float total = n * (n + 1) / 2.0f;  // sum over ranks of (rank + 1)
  const Algorithm moves = a == Algorithm::kShmDirect ? a : Algorithm::kAuto;  // no tree all_gather
  std::vector<float> x(kCount);
  for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>((r + 1) * (i % 5));
  std::vector<float> y(kCount);
  reduce(c, {.input = x.data(), .output = y.data(), .count = kCount, .root = static_cast<int>(n - 1), .algorithm = a});
  if (r == n - 1) {
    for (size_t i = 0; i < kCount; i += 4099) ASSERT_EQ(y[i], total * (i % 5)) << "reduce";
  }
  all_reduce(c, {.output = x.data(), .count = kCount, .algorithm = a});
  for (size_t i = 0; i < kCount; i += 4099) ASSERT_EQ(x[i], total * (i % 5)) << "all_reduce";
  const size_t part = kCount / n;
  std::vector<float> mine(part);
  reduce_scatter(c, {.input = x.data(), .output = mine.data(), .count = part, .algorithm = moves});
  for (size_t i = 0; i < part; i += 4099) ASSERT_EQ(mine[i], n * total * ((r * part + i) % 5)) << "reduce_scatter";
  all_gather(c, {.input = mine.data(), .output = x.data(), .count = part, .algorithm = moves});
  for (size_t i = 0; i < part * n; i += 4099) ASSERT_EQ(x[i], n * total * (i % 5)) << "all_gather";
  if (r != 0) std::fill(x.begin(), x.end(), 0.0f);
  broadcast(c, {.buffer = x.data(), .count = part * n, .root = 0, .algorithm = a});
  for (size_t i = 0; i < part * n; i += 4099) ASSERT_EQ(x[i], n * total * (i % 5)) << "broadcast";
  // Rank r's element i is (7r + i) mod 1021: all_to_all, gather and scatter each move
  // blocks of it somewhere checkable.
  for (size_t i = 0; i < part * n; ++i) x[i] = static_cast<float>((r * 7 + i) % 1021);
  all_to_all(c, {.input = x.data(), .output = y.data(), .count = part});
  for (size_t p = 0; p < n; ++p)
    for (size_t i = 0; i < part; i += 4099)
      ASSERT_EQ(y[p * part + i], static_cast<float>((p * 7 + r * part + i) % 1021)) << "all_to_all";
  gather(c, {.input = x.data(), .output = y.data(), .count = part, .root = 0});
  if (r == 0) {
    for (size_t p = 0; p < n; ++p)
      for (size_t i = 0; i < part; i += 4099)
        ASSERT_EQ(y[p * part + i], static_cast<float>((p * 7 + i) % 1021)) << "gather";
  }
  scatter(c, {.input = x.data(), .output = mine.data(), .count = part, .root = static_cast<int>(n - 1)});
  for (size_t i = 0; i < part; i += 4099)
    ASSERT_EQ(mine[i], static_cast<float>(((n - 1) * 7 + r * part + i) % 1021)) << "scatter";
}

}  // namespace loom::comm::testing
