// loom bench comm: nccl-tests style collective benchmark, run under `loom launch -n N`
// (or mpirun / torchrun). Timing is the peers' (bench/peers/mpi_coll.c, gloo_coll.cc)
// exactly, so ratios are fair: per (op, size) one checked call, 20 warm-up calls for <= 1
// MiB, iterations calibrated to ~0.1 s per rep (at least --min-iters), --reps reps (5),
// per-rep time averaged over ranks, the median reported with the reps' spread (slowest
// minus fastest, in % of the median); --dirty-inputs writes every line of each call's input
// first, as a training step does; --shared-inputs puts them where peers read them in
// place. Sizes follow nccl-tests: all_reduce / broadcast = buffer bytes, all_gather =
// gathered bytes, reduce_scatter = input bytes.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "loom/bench/bench.h"
#include "loom/comm/rendezvous.h"

namespace loom::bench {
namespace {

using namespace loom::comm;

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw InputError(cat("--sizes: '", s, "' is not a size like 8, 4K, 64M or 1G"));
  }
  std::string unit = s.substr(pos);
  double mul = unit.empty() || unit == "B" ? 1
               : unit == "K"                ? 1024.0
               : unit == "M"                ? 1048576.0
               : unit == "G"                ? 1073741824.0
                                            : -1;
  if (mul < 0 || v < 0) throw InputError(cat("--sizes: '", s, "' is not a size like 8, 4K, 64M or 1G"));
  return static_cast<size_t>(v * mul);
}

std::vector<size_t> parse_sizes(const std::string& spec, double factor) {
  std::vector<size_t> out;
  if (!(factor > 1 && factor <= 1024)) throw InputError(cat("--factor = ", factor, ": expected a number in (1, 1024]"));
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    size_t lo = parse_size(spec.substr(0, colon)), hi = parse_size(spec.substr(colon + 1));
    for (double s = std::max<size_t>(lo, 1); s <= static_cast<double>(hi); s *= factor) out.push_back(static_cast<size_t>(s));
  } else {
    for (size_t start = 0; start <= spec.size();) {
      size_t comma = spec.find(',', start);
      if (comma == std::string::npos) comma = spec.size();
      out.push_back(parse_size(spec.substr(start, comma - start)));
      start = comma + 1;
    }
  }
  if (out.empty()) throw InputError(cat("--sizes '", spec, "' names no sizes"));
  return out;
}

enum class Op { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll };

Op parse_op(const std::string& s) {
  if (s == "all_reduce" || s == "allreduce") return Op::kAllReduce;
  if (s == "all_gather" || s == "allgather") return Op::kAllGather;
  if (s == "reduce_scatter") return Op::kReduceScatter;
  if (s == "broadcast") return Op::kBroadcast;
  if (s == "reduce") return Op::kReduce;
  if (s == "all_to_all" || s == "alltoall") return Op::kAllToAll;
  throw InputError(cat("--op '", s, "' is not one of all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all"));
}

DType parse_dtype(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8})
    if (dtype_name(t) == s) return t;
  throw InputError(cat("--dtype '", s, "' is not one of f32, f64, bf16, f16, i32, i64, u8"));
}

double bus_factor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce: return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

struct Bench {
  Communicator& c;
  Op op;
  DType dt;
  Algorithm algo;
  char* sbuf;
  char* rbuf;
  size_t per_rank = 0;  // elements per call (per rank block for gather/scatter ops)
  bool dirty = false;    // BenchCommArgs::dirty_inputs

  size_t in_count() const {
    return op == Op::kReduceScatter || op == Op::kAllToAll ? per_rank * c.size() : per_rank;
  }

  // Writes one byte of every 64-byte line of this rank's input with its own value, so the
  // line is modified in this core's cache and invalid in every other, as after a backward
  // pass (volatile: the stores must happen). A broadcast's receivers have no input.
  void write_inputs() {
    if (op == Op::kBroadcast && c.rank() != 0) return;
    volatile char* in = sbuf;
    const size_t bytes = in_count() * dtype_size(dt);
    for (size_t i = 0; i < bytes; i += 64) in[i] = in[i];
  }

  void run1() {
    if (dirty) write_inputs();
    switch (op) {
      case Op::kAllReduce:
        return all_reduce(c, {.input = sbuf, .output = rbuf, .count = per_rank, .dtype = dt, .algorithm = algo});
      case Op::kAllGather:
        return all_gather(c, {.input = sbuf, .output = rbuf, .count = per_rank, .dtype = dt, .algorithm = algo});
      case Op::kReduceScatter:
        return reduce_scatter(c, {.input = sbuf, .output = rbuf, .count = per_rank, .dtype = dt, .algorithm = algo});
      case Op::kBroadcast:
        return broadcast(c, {.buffer = c.rank() == 0 ? sbuf : rbuf, .count = per_rank, .dtype = dt, .algorithm = algo});
      case Op::kReduce:
        return reduce(c, {.input = sbuf, .output = rbuf, .count = per_rank, .dtype = dt, .algorithm = algo});
      case Op::kAllToAll:
        return all_to_all(c, {.input = sbuf, .output = rbuf, .count = per_rank, .dtype = dt});
    }
  }

  // Rank r contributes r+1 everywhere; returns whether this rank's result is right.
  bool check() {
    const int n = c.size(), r = c.rank();
    size_t out_count = (op == Op::kAllGather || op == Op::kAllToAll) ? per_rank * n : per_rank;
    for (size_t i = 0; i < in_count(); ++i) store_element(dt, sbuf, i, r + 1);
    std::memset(rbuf, 0, out_count * dtype_size(dt));
    run1();
    const char* out = op == Op::kBroadcast && r == 0 ? sbuf : rbuf;
    for (size_t i = 0; i < out_count; i += 1 + out_count / 97) {
      double want = op == Op::kAllReduce || op == Op::kReduceScatter ? n * (n + 1) / 2.0
                    : op == Op::kReduce                               ? (r == 0 ? n * (n + 1) / 2.0 : 0)
                    : op == Op::kBroadcast                            ? 1.0
                                                                      : static_cast<double>(i / per_rank + 1);
      if (load_element(dt, out, i) != want) return false;
    }
    return true;
  }

};

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double all_max(Communicator& c, double v) {
  all_reduce(c, {.output = &v, .count = 1, .dtype = DType::kF64, .op = ReduceOp::kMax});
  return v;
}

}  // namespace

int run_bench_comm(const BenchCommArgs& a) {
  std::vector<Op> ops;
  for (const auto& s : a.ops) ops.push_back(parse_op(s));
  DType dt = parse_dtype(a.dtype);
  Algorithm algo = algorithm_from_name(a.algorithm);
  auto sizes = parse_sizes(a.sizes, a.factor);
  check_flag_range("--shm-slot", a.shm_slot_bytes, 4096, int64_t{1} << 30);
  check_flag_range("--reps", a.reps, 1, 1 << 20);
  check_flag_range("--warmup", a.warmup, 0, 1 << 20);
  check_flag_range("--iters", a.iters, 0, 1 << 24);
  check_flag_range("--min-iters", a.min_iters, 1, 1 << 24);

  LaunchEnv env = launch_env_from_environment();
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<Store> store;
  auto comm = join_world(env, CommConfig{.transport = a.transport, .check_fingerprints = a.fingerprints,
                                                .shm_slot_bytes = static_cast<size_t>(a.shm_slot_bytes)}, server, store);
  Communicator& c = *comm;
  const int n = c.size();
  const size_t es = dtype_size(dt);
  size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  // Inputs in ordinary memory, in memory the peers map (--shared-inputs), or both, the reps
  // alternating between them (--ab-shared).
  const bool ab = a.ab_shared, in_shared = a.shared_inputs || ab;
  SharedBuffer shared;
  std::vector<char> heap, rbuf(max_bytes + 64 * es);
  if (in_shared) shared = c.alloc_shared(rbuf.size());
  if (!a.shared_inputs || ab) heap.resize(rbuf.size());
  std::vector<char*> inputs;  // one per row of each size: ordinary first under --ab-shared
  if (!heap.empty()) inputs.push_back(heap.data());
  if (in_shared) inputs.push_back(shared.data());

  if (c.rank() == 0) {
    std::printf("# loom bench comm | np=%d | transport %s (%s) | algorithm %s | dtype %s | launched by %s\n", n,
                a.transport.c_str(), n > 1 ? c.link_kind(1).c_str() : "self", a.algorithm.c_str(),
                a.dtype.c_str(), env.source.c_str());
    std::printf("# time = median over reps of the rank-averaged per-call time; busbw as nccl-tests\n");
    if (a.dirty_inputs) std::printf("# inputs rewritten before each call (every 64-byte line), timed with it\n");
    if (in_shared)
      std::printf("# inputs in %s%s\n", shared.shared() ? "shared memory: same-host peers read them in place"
                                                         : "ordinary memory (no shared window in this group)",
                  ab ? "; each size's reps alternate between an ordinary input (first row) and a shared one "
                       "(second row, then their ratio)"
                     : "");
  }
  bool all_ok = true;
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op op = ops[k];
    if (c.rank() == 0) {
      std::printf("# %s\n# %12s %12s %5s %12s %11s %11s %6s %5s %7s\n", a.ops[k].c_str(), "size", "count", "type",
                  "time_us", "algbw_GBps", "busbw_GBps", "iters", "check", "spread%");
    }
    for (size_t size : sizes) {
      size_t elems = std::max<size_t>(size / es, 1);
      bool split = op == Op::kAllGather || op == Op::kReduceScatter || op == Op::kAllToAll;
      size_t per_rank = split ? std::max<size_t>(elems / n, 1) : elems;
      size_t bytes = (split ? per_rank * n : per_rank) * es;
      if (split && bytes > rbuf.size()) continue;
      std::vector<Bench> benches;
      for (char* in : inputs) benches.push_back({c, op, dt, algo, in, rbuf.data(), per_rank, a.dirty_inputs});
      int ok = 1;
      if (a.check)
        for (Bench& b : benches) ok &= b.check() ? 1 : 0;
      int32_t ok_all = ok;
      all_reduce(c, {.output = &ok_all, .count = 1, .dtype = DType::kI32, .op = ReduceOp::kMin});
      all_ok &= ok_all == 1;
      double t0 = now_s();
      int warm = bytes <= (1u << 20) ? std::max(a.warmup, 20) : a.warmup;
      for (Bench& b : benches)
        for (int i = 0; i < warm; ++i) b.run1();
      double per_call = all_max(c, (now_s() - t0) / std::max(warm * static_cast<int>(benches.size()), 1));
      const int iters = a.iters > 0 ? a.iters
                                    : std::max(a.min_iters, std::min(2000, static_cast<int>(0.1 / std::max(per_call, 1e-9))));
      std::vector<std::vector<double>> times(benches.size());
      for (int r = 0; r < a.reps; ++r) {
        for (size_t j = 0; j < benches.size(); ++j) {
          const size_t which = r % 2 == 0 ? j : benches.size() - 1 - j;  // ABBA: neither always goes first
          barrier(c);
          double s = now_s();
          for (int i = 0; i < iters; ++i) benches[which].run1();
          double dt_avg = (now_s() - s) / iters;
          all_reduce(c, {.output = &dt_avg, .count = 1, .dtype = DType::kF64, .op = ReduceOp::kAvg});
          times[which].push_back(dt_avg);
        }
      }
      std::vector<double> medians;
      for (auto& ts : times) {
        std::sort(ts.begin(), ts.end());
        double t = ts[ts.size() / 2];
        medians.push_back(t);
        double algbw = static_cast<double>(bytes) / t / 1e9;
        if (c.rank() == 0)
          std::printf("  %12zu %12zu %5s %12.2f %11.3f %11.3f %6d %5s %7.1f\n", bytes, per_rank, a.dtype.c_str(), t * 1e6,
                      algbw, algbw * bus_factor(op, n), iters, ok_all ? "ok" : "WRONG", 100.0 * (ts.back() - ts.front()) / t);
      }
      if (c.rank() == 0) {
        if (ab) std::printf("#   shared / ordinary busbw: %.2fx\n", medians[0] / medians[1]);
        std::fflush(stdout);
      }
    }
  }
  barrier(c);
  if (!all_ok) {
    if (c.rank() == 0) std::fprintf(stderr, "loom bench comm: some results were wrong (see the check column)\n");
    return 1;
  }
  return 0;
}

}  // namespace loom::bench
