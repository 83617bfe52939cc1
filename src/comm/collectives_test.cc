// Every collective x dtype x op x world size 1..8 x counts, ranks as threads, over each
// path (tcp ring, tcp tree, shm-direct), checked against closed-form results.
#include <gtest/gtest.h>

#include <numeric>

#include "comm/comm_testing.h"

namespace loom::comm {
namespace {

using testing::expected;
using testing::load;
using testing::run_ranks;
using testing::store;
using testing::value;

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                             DType::kI32, DType::kI64, DType::kU8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProd};

struct Path {
  const char* name;
  const char* transport;
  Algorithm algorithm;
};
constexpr Path kPaths[] = {{"tcp_ring", "tcp", Algorithm::kRing},
                           {"tcp_tree", "tcp", Algorithm::kTree},
                           {"shm", "shm", Algorithm::kShmDirect}};

std::vector<size_t> counts_for(int n) { return {0, 1, 7, static_cast<size_t>(3 * n + 1), 1000}; }

// Fills rank r's element i of a buffer of `count` (offset by `base` in value()).
std::vector<char> make(DType dt, ReduceOp op, int r, size_t count, size_t base = 0) {
  std::vector<char> b(count * dtype_size(dt) + 1);
  for (size_t i = 0; i < count; ++i) store(dt, b.data(), i, value(op, r, base + i));
  return b;
}

#define EXPECT_ELEM(dt, buf, i, want, what)                                                  \
  do {                                                                                       \
    double got_ = load(dt, buf, i);                                                          \
    if (got_ != (want)) {                                                                    \
      ADD_FAILURE() << what << " " << dtype_name(dt) << " element " << i << ": got " << got_ \
                    << ", want " << (want);                                                  \
      return;                                                                                \
    }                                                                                        \
  } while (0)

void check_all_reduce(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count, bool in_place) {
  auto in = make(dt, op, c.rank(), count);
  std::vector<char> out(in.size());
  if (in_place) out = in;
  all_reduce(c, {.input = in_place ? nullptr : in.data(), .output = out.data(), .count = count,
                 .dtype = dt, .op = op, .algorithm = a});
  for (size_t i = 0; i < count; ++i)
    EXPECT_ELEM(dt, out.data(), i, expected(op, dt, c.size(), i), "all_reduce " << reduce_op_name(op));
}

void check_reduce_scatter(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count) {
  const int n = c.size();
  auto in = make(dt, op, c.rank(), count * n);
  std::vector<char> out(count * dtype_size(dt) + 1);
  reduce_scatter(c, {.input = in.data(), .output = out.data(), .count = count, .dtype = dt, .op = op,
                     .algorithm = a == Algorithm::kTree ? Algorithm::kRing : a});
  for (size_t i = 0; i < count; ++i)
    EXPECT_ELEM(dt, out.data(), i, expected(op, dt, n, c.rank() * count + i), "reduce_scatter");
}

void check_reduce(Communicator& c, Algorithm a, DType dt, ReduceOp op, size_t count, int root) {
  auto in = make(dt, op, c.rank(), count);
  std::vector<char> out(in.size());
  reduce(c, {.input = in.data(), .output = out.data(), .count = count, .dtype = dt, .op = op,
             .root = root, .algorithm = a == Algorithm::kRing ? Algorithm::kTree : a});
  if (c.rank() != root) return;
  for (size_t i = 0; i < count; ++i) EXPECT_ELEM(dt, out.data(), i, expected(op, dt, c.size(), i), "reduce");
}

void check_moves(Communicator& c, Algorithm a, DType dt, size_t count) {
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

class Collectives : public ::testing::TestWithParam<std::tuple<int, Path>> {};

TEST_P(Collectives, MatchClosedForm) {
  auto [n, path] = GetParam();
  CommConfig cfg{.transport = path.transport, .timeout = milliseconds(20000), .shm_slot_bytes = 64 << 10};
  run_ranks(n, cfg, [&, n = n, path = path](Communicator& c) {
    for (DType dt : kDTypes) {
      for (size_t count : counts_for(n)) {
        for (ReduceOp op : kOps) {
          check_all_reduce(c, path.algorithm, dt, op, count, false);
          check_reduce_scatter(c, path.algorithm, dt, op, count);
        }
        check_all_reduce(c, path.algorithm, dt, ReduceOp::kSum, count, true);
        check_reduce(c, path.algorithm, dt, ReduceOp::kSum, count, n - 1);
        check_reduce(c, path.algorithm, dt, ReduceOp::kMax, count, 0);
        check_moves(c, path.algorithm, dt, count);
      }
    }
    // A prime count far above the slot and chunk sizes, so rounds and chunks are uneven.
    check_all_reduce(c, path.algorithm, DType::kF32, ReduceOp::kSum, 1000003, false);
    check_all_reduce(c, path.algorithm, DType::kBF16, ReduceOp::kAvg, 1000003, true);
    check_reduce_scatter(c, path.algorithm, DType::kF32, ReduceOp::kSum, 1000003 / n);
    check_moves(c, path.algorithm, DType::kF32, 1000003 / n);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::ValuesIn(kPaths)),
                         [](const auto& info) {
                           return cat("n", std::get<0>(info.param), "_", std::get<1>(info.param).name);
                         });

// Same inputs, same bits, every run: the reduction order depends only on the world size.
TEST(Collectives, DeterministicBits) {
  for (const Path& path : kPaths) {
    std::vector<std::vector<float>> results;
    for (int run = 0; run < 2; ++run) {
      std::vector<float> rank0;
      std::mutex mu;
      run_ranks(5, {.transport = path.transport, .shm_slot_bytes = 64 << 10}, [&](Communicator& c) {
        std::vector<float> x(300001);
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.001f * i * (c.rank() + 1)) / 3.0f;
        all_reduce(c, {.output = x.data(), .count = x.size(), .algorithm = path.algorithm});
        std::lock_guard lock(mu);
        if (c.rank() == 0) rank0 = x;
      });
      results.push_back(rank0);
    }
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4)) << path.name;
  }
}

// One large case (16M elements) per collective and transport.
TEST(Collectives, Large16M) {
  constexpr size_t kCount = 16u << 20;
  for (const char* transport : {"tcp", "shm"}) {
    run_ranks(2, {.transport = transport}, [&](Communicator& c) {
      std::vector<float> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>((c.rank() + 1) * (i % 5));
      all_reduce(c, {.output = x.data(), .count = kCount});
      for (size_t i = 0; i < kCount; i += 4099) ASSERT_EQ(x[i], 3.0f * (i % 5)) << transport;
      std::vector<float> half(kCount / 2);
      reduce_scatter(c, {.input = x.data(), .output = half.data(), .count = kCount / 2});
      for (size_t i = 0; i < half.size(); i += 4099)
        ASSERT_EQ(half[i], 6.0f * ((c.rank() * kCount / 2 + i) % 5)) << transport;
      all_gather(c, {.input = half.data(), .output = x.data(), .count = kCount / 2});
      for (size_t i = 0; i < kCount; i += 4099) ASSERT_EQ(x[i], 6.0f * (i % 5)) << transport;
      if (c.rank() == 1) std::fill(x.begin(), x.end(), 0.0f);
      broadcast(c, {.buffer = x.data(), .count = kCount, .root = 0});
      for (size_t i = 0; i < kCount; i += 4099) ASSERT_EQ(x[i], 6.0f * (i % 5)) << transport;
    });
  }
}

TEST(Collectives, SplitMakesSubGroups) {
  run_ranks(6, {}, [](Communicator& c) {
    auto sub = c.split(c.rank() % 2, -c.rank());  // reversed order inside each group
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->size(), 3);
    int32_t v = c.rank();
    all_reduce(*sub, {.output = &v, .count = 1, .dtype = DType::kI32});
    EXPECT_EQ(v, c.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    EXPECT_EQ(sub->rank(), 2 - c.rank() / 2);
    auto none = c.split(c.rank() == 0 ? -1 : 0, 0);
    EXPECT_EQ(none == nullptr, c.rank() == 0);
  });
}

TEST(Collectives, AsyncOpsRunInIssueOrderAndOverlap) {
  run_ranks(3, {.transport = "tcp"}, [](Communicator& c) {
    std::vector<std::vector<float>> bufs(8, std::vector<float>(100000, 1.0f));
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(all_reduce_async(c, {.output = b.data(), .count = b.size()}));
    int32_t v = 1;  // a blocking op after async ones waits for them, then runs
    all_reduce(c, {.output = &v, .count = 1, .dtype = DType::kI32});
    EXPECT_EQ(v, 3);
    for (auto& w : works) {
      EXPECT_TRUE(w.done());
      w.wait();
    }
    for (auto& b : bufs) EXPECT_EQ(b[99999], 3.0f);
  });
}

TEST(Collectives, BadArgumentsAreInputErrors) {
  run_ranks(1, {}, [](Communicator& c) {
    float x = 0;
    EXPECT_THROW(broadcast(c, {.buffer = &x, .count = 1, .root = 1}), InputError);
    EXPECT_THROW(all_reduce(c, {.output = nullptr, .count = 3}), InputError);
    EXPECT_THROW(all_reduce(c, {.output = &x, .count = 1, .dtype = DType::kU16}), InputError);
    EXPECT_THROW(send(c, {.buffer = &x, .count = 1, .peer = 0}), InputError);
  });
  EXPECT_THROW(algorithm_from_name("fastest"), InputError);
  HashStore store;
  EXPECT_THROW(Communicator::create(store, 0, 1, {.transport = "carrier-pigeon"}), InputError);
}

}  // namespace
}  // namespace loom::comm
