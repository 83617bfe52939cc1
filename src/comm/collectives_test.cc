// Every collective x dtype x op x world size 1..8 x counts, ranks as threads, over each
// path (tcp ring, tcp tree, shm-direct, and hierarchical with threads posing as ranks on
// two or three hosts), checked against closed-form results (comm_checks.h).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstring>
#include <thread>

#include "comm/comm_checks.h"
#include "comm/communicator_impl.h"
#include "comm/copy.h"
#include "comm/transport/shm/shm_window.h"

namespace loom::comm {
namespace {

using testing::run_ranks;

struct Path {
  const char* name;
  const char* transport;
  Algorithm algorithm;
  int hosts = 1;  // ranks r and r + hosts share a host
};
constexpr Path kPaths[] = {{"tcp_ring", "tcp", Algorithm::kRing},
                           {"tcp_tree", "tcp", Algorithm::kTree},
                           {"shm", "shm", Algorithm::kShmDirect},
                           {"hier_shm", "auto", Algorithm::kAuto, 2},
                           {"hier_tcp", "tcp", Algorithm::kHierarchical, 3}};

std::function<std::string(int)> hosts_of(const Path& p) {
  return [h = p.hosts](int r) { return cat("host", r % h); };
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, Path>> {};

TEST_P(Collectives, MatchClosedForm) {
  auto [n, path] = GetParam();
  CommConfig cfg{.transport = path.transport, .timeout = milliseconds(20000), .shm_slot_bytes = 64 << 10};
  run_ranks(n, cfg, [path = path](Communicator& c) { testing::sweep(c, path.algorithm); }, hosts_of(path));
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
      }, hosts_of(path));
      results.push_back(rank0);
    }
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4)) << path.name;
  }
}

// Small broadcasts and scatters let their root run up to ShmWindow::kPosts rounds ahead
// of slow receivers. Each block of 50 calls starts with receivers asleep while the root
// works through 30 inline calls (16 of them before it must wait), then mixes in
// slot-sized calls and an all_reduce. Every value must come from its own call: a post
// line reused too early shows as a mismatch with a later call (checked by letting the
// root run 32 ahead).
TEST(Collectives, RootsRunAheadOfSlowReceivers) {
  run_ranks(3, {.transport = "shm", .shm_slot_bytes = 64 << 10}, [](Communicator& c) {
    std::vector<int32_t> buf(3 * 2000), part(2000);
    for (int i = 0; i < 600; ++i) {
      const int root = (i / 200) % 3, phase = i % 50;
      const bool inline_round = phase < 30;
      // Inline: broadcast of 4 or 28 bytes, scatter of 12 or 24 in all; else 36 or 8000
      // bytes a rank.
      const bool scatters = inline_round ? i % 4 == 0 : i % 3 == 0;
      const size_t n = inline_round ? (scatters ? (i % 8 ? 2 : 1) : (i % 2 ? 1 : 7)) : (i % 2 ? 9 : 2000);
      if (c.rank() != root && phase == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (scatters) {
        for (size_t k = 0; k < 3 * n; ++k) buf[k] = c.rank() == root ? static_cast<int32_t>(i * 7 + k) : -1;
        scatter(c, {.input = buf.data(), .output = part.data(), .count = n, .dtype = DType::kI32, .root = root});
        for (size_t k = 0; k < n; ++k) ASSERT_EQ(part[k], static_cast<int32_t>(i * 7 + c.rank() * n + k)) << i;
      } else {
        for (size_t k = 0; k < n; ++k) buf[k] = c.rank() == root ? static_cast<int32_t>(i * 1000 + k) : -1;
        broadcast(c, {.buffer = buf.data(), .count = n, .dtype = DType::kI32, .root = root});
        for (size_t k = 0; k < n; ++k) ASSERT_EQ(buf[k], static_cast<int32_t>(i * 1000 + k)) << i;
      }
      if (phase == 40) {
        int32_t v = c.rank() + i;
        all_reduce(c, {.output = &v, .count = 1, .dtype = DType::kI32});
        ASSERT_EQ(v, 3 * i + 3) << i;
      }
    }
  });
}

// One large case (16M elements) per collective and transport.
TEST(Collectives, Large16M) {
  for (const char* transport : {"tcp", "shm"})
    run_ranks(2, {.transport = transport}, [](Communicator& c) { testing::large_16m(c, Algorithm::kAuto); });
}

// The streaming copy behind large slot fills and outputs: every length around its 64-byte
// lines, at every alignment of source and destination, copies exactly [dst, dst + n).
TEST(Collectives, StreamCopyAnyAlignmentAndLength) {
  std::vector<unsigned char> src(4096 + 128), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {0, 1, 15, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096}) {
    for (size_t da = 0; da < 64; da += 5) {
      for (size_t sa : {0, 1, 33}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        stream_copy(dst.data() + 64 + da, src.data() + sa, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          bool inside = i >= 64 + da && i < 64 + da + n;
          unsigned char want = inside ? src[sa + i - 64 - da] : 0xEE;
          ASSERT_EQ(dst[i], want) << "n " << n << " dst offset " << da << " src offset " << sa << " byte " << i;
        }
      }
    }
  }
}

// copy_bytes: memmove's result at every placement, the slow one it avoids (destination
// 1-63 bytes past the source modulo 4 KiB, which takes the vector loop) included, at
// lengths around its 2 KiB threshold and the loop's 64-byte steps, and for overlapping
// ranges either way (which must stay memmove).
TEST(Collectives, CopyBytesEqualsMemmoveAtEveryPlacement) {
  constexpr size_t kArena = 3 * 8192;
  std::vector<unsigned char> arena(kArena), want(kArena);
  const auto pattern = [&] {
    for (size_t i = 0; i < kArena; ++i) arena[i] = static_cast<unsigned char>(i * 131 + 7);
  };
  std::vector<long> aheads = {0L, 64L, 100L, 4095L, 4097L, 4096L + 16, 4096L + 63, -16L, -1L, -4080L};
  for (long ahead = 1; ahead < 64; ++ahead) aheads.push_back(ahead);  // the vector loop, every store alignment
  for (size_t n : {0, 1, 2047, 2048, 2049, 2111, 2175, 4096, 5000}) {
    for (long ahead : aheads) {
      const size_t s = 8192;  // source offset in the arena; the destination `ahead` past it
      const size_t d = static_cast<size_t>(static_cast<long>(s) + ahead);
      pattern();
      want = arena;
      if (n) std::memmove(want.data() + d, want.data() + s, n);
      copy_bytes(arena.data() + d, arena.data() + s, n);
      ASSERT_EQ(arena, want) << "n " << n << " destination " << ahead << " bytes past the source";
    }
  }
  copy_bytes(nullptr, nullptr, 0);  // empty ops pass null buffers
}

// tee_copy, behind all_gather's own part (slot and output in one pass): both destinations
// get exactly the source's bytes and nothing around them, for every store kind, at lengths
// around its 64-byte steps and at alignments where the second destination can and cannot
// stream.
TEST(Collectives, TeeCopyFillsBothDestinationsExactly) {
  std::vector<unsigned char> src(4096 + 128), a(4096 + 256), b(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  const auto expect = [&](const std::vector<unsigned char>& dst, size_t at, size_t sa, size_t n, const char* which) {
    for (size_t i = 0; i < dst.size(); ++i) {
      bool inside = i >= at && i < at + n;
      ASSERT_EQ(dst[i], inside ? src[sa + i - at] : 0xEE) << which << " byte " << i << " n " << n;
    }
  };
  for (size_t n : {0, 1, 15, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096}) {
    for (size_t da : {0, 5, 16, 33, 63}) {
      for (size_t db : {0, 1, 16, 48}) {
        for (int kinds = 0; kinds < 4; ++kinds) {
          std::fill(a.begin(), a.end(), 0xEE);
          std::fill(b.begin(), b.end(), 0xEE);
          const size_t sa = (da + db) % 7;
          tee_copy(a.data() + 64 + da, b.data() + 64 + db, src.data() + sa, n, kinds & 1, kinds & 2);
          expect(a, 64 + da, sa, n, "a");
          expect(b, 64 + db, sa, n, "b");
        }
      }
    }
  }
}

// Inputs in alloc_shared memory, which peers read in place (and, in a group of 3 or 4,
// one rank's in ordinary memory, which goes through its slot): all_reduce, all_gather,
// reduce_scatter and broadcast (from a root whose buffer is shared and, in a group of 3 or
// 4, from one whose is not), out of place and in place, at offsets inside the buffer,
// below, at and above the size from which inputs are read in place, in one round and in
// many (64 KiB slots).
TEST(Collectives, SharedInputsMatchClosedForm) {
  for (int n : {2, 3, 4}) {
    run_ranks(n, {.transport = "shm", .shm_slot_bytes = 64 << 10}, [n](Communicator& c) {
      const int r = c.rank();
      const size_t most = 300001 * static_cast<size_t>(n) + 64;
      SharedBuffer shared = c.alloc_shared(most * 4);
      ASSERT_TRUE(shared.shared());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(shared.data()) % 4096, 0u);
      std::vector<float> heap(most);
      float* buf = (n > 2 && r == 1 ? heap.data() : reinterpret_cast<float*>(shared.data())) + 16;
      for (size_t count : {size_t{10}, size_t{16383}, size_t{16384}, size_t{100000}, size_t{300001}}) {
        const std::string what = cat("n ", n, " count ", count, " rank ", r);
        std::vector<float> out(count * n);
        for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(testing::value(ReduceOp::kSum, r, i));
        all_reduce(c, {.input = buf, .output = out.data(), .count = count});
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(out[i], testing::expected(ReduceOp::kSum, DType::kF32, n, i)) << what << " i " << i;
        all_reduce(c, {.output = buf, .count = count});  // in place
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(buf[i], testing::expected(ReduceOp::kSum, DType::kF32, n, i)) << what << " in place, i " << i;
        for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(r * 1000003 + i);
        all_gather(c, {.input = buf, .output = out.data(), .count = count});
        for (size_t i = 0; i < count * n; ++i)
          ASSERT_EQ(out[i], static_cast<float>(i / count * 1000003 + i % count)) << what << " all_gather, i " << i;
        for (size_t i = 0; i < count * n; ++i) buf[i] = static_cast<float>(testing::value(ReduceOp::kSum, r, i));
        reduce_scatter(c, {.input = buf, .output = out.data(), .count = count});
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(out[i], testing::expected(ReduceOp::kSum, DType::kF32, n, r * count + i)) << what << " reduce_scatter, i " << i;
        for (int root : {n - 1, 1}) {
          for (size_t i = 0; i < count; ++i) buf[i] = r == root ? static_cast<float>(i + root) : -1.0f;
          broadcast(c, {.buffer = buf, .count = count, .root = root});
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(buf[i], static_cast<float>(i + root)) << what << " broadcast from " << root << ", i " << i;
        }
        // In place: this rank's block of the output is its input.
        float* whole = buf;
        for (size_t i = 0; i < count; ++i) whole[r * count + i] = static_cast<float>(r * 1000003 + i);
        all_gather(c, {.input = whole + r * count, .output = whole, .count = count});
        for (size_t i = 0; i < count * n; ++i)
          ASSERT_EQ(whole[i], static_cast<float>(i / count * 1000003 + i % count)) << what << " in place, i " << i;
      }
    });
  }
}

// all_reduce and reduce store each rank's reduced slice for its peers with ordinary stores
// or streaming ones, as the op's decider picks (ShmWindow::choose_slice_mode): either kind,
// forced on every rank, gives the closed form, for f32, bf16 (its own block loop) and i32,
// in one round and in many (64 KiB slots), out of place and in place, and for a reduce whose
// root (its decider) is not rank 0.
TEST(Collectives, ReducedSlicesStoredEitherWayMatchClosedForm) {
  for (int n : {2, 3}) {
    run_ranks(n, {.transport = "shm", .shm_slot_bytes = 64 << 10}, [n](Communicator& c) {
      ShmWindow* w = CommunicatorAccess::impl(c).window.get();
      ASSERT_NE(w, nullptr);
      for (int mode : {1, 0}) {
        w->force_slice_mode(mode);
        for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
          for (size_t count : {size_t{9000}, size_t{70001}}) {
            SCOPED_TRACE(cat("n ", n, " mode ", mode, " ", dtype_name(dt), " count ", count));
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
              testing::check_all_reduce(c, Algorithm::kShmDirect, dt, op, count, false);
              testing::check_all_reduce(c, Algorithm::kShmDirect, dt, op, count, true);
            }
            testing::check_reduce(c, Algorithm::kShmDirect, dt, ReduceOp::kSum, count, n - 1);
          }
        }
      }
      w->force_slice_mode(-1);
    });
  }
}

// The decider's pick: ordinary stores until streaming has been measured clearly cheaper
// (by more than the margin), the other kind every 64th round, and the pick a peer reads
// from the decider's post is the one it posted.
TEST(Collectives, SliceStoresFollowTheirMeasuredCost) {
  HashStore store;
  std::unique_ptr<ShmWindow> w[2];
  std::thread t[2];
  const Deadline d = Clock::now() + std::chrono::seconds(10);
  for (int i = 0; i < 2; ++i) t[i] = std::thread([&, i] { w[i] = ShmWindow::create(store, "w", i, 2, 64 << 10, d); });
  for (auto& th : t) th.join();
  const auto picks = [&] {  // the picks of 128 rounds: how many streamed
    int streamed = 0;
    for (int r = 0; r < 128; ++r) streamed += w[0]->choose_slice_mode();
    return streamed;
  };
  EXPECT_EQ(picks(), 2);  // nothing measured: ordinary, streaming tried twice
  w[0]->note_slice_cost(0, 1.0);
  w[0]->note_slice_cost(1, 0.95);  // within the margin
  EXPECT_EQ(picks(), 2);
  for (int i = 0; i < 8; ++i) w[0]->note_slice_cost(1, 0.5);
  EXPECT_EQ(picks(), 126);  // streaming, ordinary tried twice
  for (int i = 0; i < 8; ++i) w[0]->note_slice_cost(0, 0.2);
  EXPECT_EQ(picks(), 2);
  w[0]->force_slice_mode(1);
  EXPECT_EQ(picks(), 128);
  for (int mode : {1, 0}) {
    w[0]->post_slice_mode(7, mode);
    EXPECT_EQ(w[1]->slice_mode(0, 7), mode);
  }
}

// The window's side of it: an input in this rank's part of a shared region, and large
// enough, is named in the round's post; a peer finds the same bytes through its own
// mapping. Anything else goes through the slot.
TEST(Collectives, PlacedInputsAreNamedInThePostAndReadInPlace) {
  HashStore store;
  std::unique_ptr<ShmWindow> w[2];
  std::shared_ptr<ShmWindow::Region> region[2];
  std::thread t[2];
  for (int i = 0; i < 2; ++i)
    t[i] = std::thread([&, i] {
      Deadline d = Clock::now() + milliseconds(10000);
      w[i] = ShmWindow::create(store, "w", i, 2, 64 << 10, d);
      region[i] = w[i]->share(store, "w", size_t{1} << (20 + i), d);
    });
  for (auto& th : t) th.join();
  char* mine = ShmWindow::region_data(*region[0]);
  for (size_t k = 0; k < (1 << 20); ++k) mine[k] = static_cast<char>(k * 7);
  const size_t small = ShmWindow::kPlacedMinBytes - 1;
  EXPECT_FALSE(w[0]->place(1, mine, small));
  EXPECT_EQ(w[1]->input(0, 1, small), w[1]->data(0, 1, small));
  std::vector<char> heap(1 << 20);
  EXPECT_FALSE(w[0]->place(2, heap.data(), heap.size()));
  EXPECT_FALSE(w[0]->place(3, mine + 4096, 1 << 20));  // runs past rank 0's part
  EXPECT_FALSE(w[1]->place(4, ShmWindow::region_data(*region[1]) - 4096, 100000));
  ASSERT_TRUE(w[0]->place(5, mine + 4096, 100000));
  const char* seen = w[1]->input(0, 5, 100000);
  EXPECT_NE(seen, w[1]->data(0, 5, 100000));
  EXPECT_EQ(std::memcmp(seen, mine + 4096, 100000), 0);
  mine[5000] = 42;  // the same memory, not a copy
  EXPECT_EQ(seen[5000 - 4096], 42);
}

// A rank whose input its peers read in place returns only once they are done with it:
// rank 0 overwrites its input the moment all_gather, reduce_scatter or broadcast returns,
// while rank 1 is still slow to copy (its output's pages are not yet mapped, or it comes
// late to the broadcast); rank 1 must still have rank 0's bytes.
TEST(Collectives, SharedInputsAreTheCallersOnceTheOpReturns) {
  run_ranks(2, {.transport = "shm", .shm_slot_bytes = 4 << 20}, [](Communicator& c) {
    const size_t count = 1 << 20, bytes = count * 4;
    SharedBuffer in = c.alloc_shared(bytes);
    auto* x = reinterpret_cast<float*>(in.data());
    for (int iter = 0; iter < 10; ++iter) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(c.rank() + 1);
      void* p = ::mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(p, MAP_FAILED);
      auto* out = static_cast<float*>(p);
      if (c.rank() == 0) std::memset(out, 0, 2 * bytes);  // rank 0's copy is the fast one
      const int op = iter % 3;  // all_gather, reduce_scatter, broadcast
      if (op == 0) all_gather(c, {.input = x, .output = out, .count = count});
      if (op == 1) reduce_scatter(c, {.input = x, .output = out, .count = count / 2});
      if (op == 2) {
        if (c.rank() == 1) std::this_thread::sleep_for(milliseconds(2));
        broadcast(c, {.buffer = x, .count = count, .root = 0});
      }
      if (c.rank() == 0) std::memset(x, 0xff, bytes);
      barrier(c);
      size_t wrong = 0;
      if (op == 0) {
        for (size_t i = 0; i < 2 * count; ++i) wrong += out[i] != static_cast<float>(i / count + 1);
      } else if (c.rank() == 1) {
        const float want = op == 1 ? 3.0f : 1.0f;
        for (size_t i = 0; i < (op == 1 ? count / 2 : count); ++i) wrong += (op == 1 ? out[i] : x[i]) != want;
      }
      EXPECT_EQ(wrong, 0u) << "rank " << c.rank() << " op " << op << " iteration " << iter;
      ::munmap(p, 2 * bytes);
    }
  });
}

// A broadcast whose receivers copy from the root's shared buffer with streaming stores
// (an output of 32 MiB or more streams on any machine, smaller ones as the cache decides):
// every byte arrives, in every round (1 MiB slots, a last one partial), at a buffer offset
// that is not a multiple of the stores' 16 or 32 bytes, from either rank as root. A
// receiver's buffer in ordinary memory reads the same.
TEST(Collectives, SharedBroadcastStreamedPastTheCacheMatches) {
  run_ranks(2, {.transport = "shm"}, [](Communicator& c) {
    const size_t count = (size_t{32} << 18) + 12345;  // 32 MiB of floats and a tail
    SharedBuffer shared = c.alloc_shared(count * 4 + 64);
    std::vector<float> heap(count);
    for (int root : {0, 1}) {
      for (bool receiver_shared : {true, false}) {
        float* buf = c.rank() == root || receiver_shared ? reinterpret_cast<float*>(shared.data() + 4) : heap.data();
        for (size_t i = 0; i < count; ++i) buf[i] = c.rank() == root ? static_cast<float>(i % 1000003 + root) : -1.0f;
        broadcast(c, {.buffer = buf, .count = count, .root = root});
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += buf[i] != static_cast<float>(i % 1000003 + root);
        EXPECT_EQ(wrong, 0u) << "rank " << c.rank() << " root " << root << " receiver shared " << receiver_shared;
        barrier(c);  // the next root's writes wait for this broadcast's reads
      }
    }
  });
}

// all_gather outputs from a sixth of the last-level cache (3 ranks on 2 CPUs) to 32 MiB stream
// all but a head that stays cached (on a 32 MiB cache, 6 and 12 MiB here): every byte arrives
// where the head ends inside a round and inside a peer's part, from inputs in shared memory
// (at an offset that is not a multiple of the stores' width) and in ordinary memory.
TEST(Collectives, AllGatherWithACachedHeadMatches) {
  run_ranks(3, {.transport = "shm", .shm_slot_bytes = 1 << 20}, [](Communicator& c) {
    SharedBuffer shared = c.alloc_shared((size_t{4} << 20) + 64);
    for (size_t count : {(size_t{1} << 19) + 7, (size_t{1} << 20) + 1001}) {  // 6 and 12 MiB of output, and tails
      std::vector<float> heap(count), out(3 * count);
      for (bool in_shared : {true, false}) {
        float* in = in_shared ? reinterpret_cast<float*>(shared.data() + 4) : heap.data();
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(c.rank() * 1000003 + i % 999983);
        std::fill(out.begin(), out.end(), -1.0f);
        all_gather(c, {.input = in, .output = out.data(), .count = count});
        size_t wrong = 0;
        for (size_t i = 0; i < 3 * count; ++i) {
          wrong += out[i] != static_cast<float>(i / count * 1000003 + i % count % 999983);
        }
        EXPECT_EQ(wrong, 0u) << "rank " << c.rank() << " count " << count << " shared " << in_shared;
        barrier(c);  // the next call's writes to the inputs wait for this one's reads
      }
    }
  });
}

// A rank that released its shared buffer cannot read a peer's input in it: a CommError
// that names the peer and the buffer, not a read of unmapped memory.
TEST(Collectives, SharedInputReleasedOnOneRankIsNamed) {
  std::mutex mu;
  std::string error;
  run_ranks(2, {.transport = "shm", .timeout = milliseconds(5000)}, [&](Communicator& c) {
    SharedBuffer in = c.alloc_shared(1 << 20);
    std::vector<char> heap(1 << 20), out(2 << 20);
    if (c.rank() == 1) in = SharedBuffer{};
    try {
      all_gather(c, {.input = c.rank() == 0 ? in.data() : heap.data(), .output = out.data(),
                     .count = 1 << 20, .dtype = DType::kU8});
    } catch (const CommError& e) {
      std::lock_guard lock(mu);
      if (c.rank() == 1) error = e.what();
    }
  });
  EXPECT_NE(error.find("rank 0 posted its input in shared buffer #1, which this rank (rank 1) has released"),
            std::string::npos)
      << error;
}

// More than /dev/shm holds is refused at once, with the bytes asked, not a SIGBUS later;
// and on every rank, when only one rank asked too much, so that all can fall back alike.
// The next call's ids are fresh.
TEST(Collectives, SharedBufferLargerThanDevShmIsRefused) {
  run_ranks(3, {.transport = "shm", .timeout = milliseconds(5000)}, [](Communicator& c) {
    try {
      c.alloc_shared(c.rank() == 1 ? size_t{1} << 50 : 4096);
      ADD_FAILURE() << "a 1 PiB shared buffer was granted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 cannot share 1125899906842624 bytes in /dev/shm ("), std::string::npos)
          << e.what();
    }
    SharedBuffer b = c.alloc_shared(1 << 20);
    EXPECT_TRUE(b.shared());
    float* x = reinterpret_cast<float*>(b.data());
    for (int i = 0; i < (1 << 18); ++i) x[i] = static_cast<float>(c.rank() + 1);
    all_reduce(c, {.output = x, .count = 1 << 18});
    EXPECT_EQ(x[(1 << 18) - 1], 6.0f);
  });
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

// Both halves of an exchange issued async, one after the other, each far larger than the
// socket buffers: the send must not block the recv queued behind it.
TEST(Collectives, AsyncExchangeLargerThanSocketBuffers) {
  run_ranks(2, {.transport = "tcp"}, [](Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<float> out(8u << 20, static_cast<float>(c.rank() + 1)), in(out.size());
    Work s = send_async(c, {.buffer = out.data(), .count = out.size(), .peer = peer});
    Work r = recv_async(c, {.buffer = in.data(), .count = in.size(), .peer = peer});
    s.wait();
    r.wait();
    EXPECT_EQ(in.front(), peer + 1.0f);
    EXPECT_EQ(in.back(), peer + 1.0f);
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
