// Test helpers for collectives: ranks as threads over a shared HashStore, and typed
// element access so one closed-form check covers every dtype.
#pragma once

#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm::testing {

// Runs body(comm) on `n` threads, each a rank of one communicator; rethrows the first
// exception (after all threads finish). `host_of(r)`, when given, names rank r's host
// (CommConfig::host_id), so threads can stand for ranks on several machines.
inline void run_ranks(int n, const CommConfig& config,
                      const std::function<void(Communicator&)>& body,
                      const std::function<std::string(int)>& host_of = {}) {
  HashStore store;
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        CommConfig mine = config;
        if (host_of) mine.host_id = host_of(r);
        auto comm = Communicator::create(store, r, n, mine);
        body(*comm);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

inline double load(DType dt, const void* p, size_t i) { return load_element(dt, p, i); }
inline void store(DType dt, void* p, size_t i, double v) { store_element(dt, p, i, v); }

inline bool is_float(DType dt) {
  return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kBF16 || dt == DType::kF16;
}

// Rank r's element i for op `op`: small integers, so every sum, product, min and max over
// 8 ranks is exact in every dtype (bf16 holds integers up to 256 exactly).
inline double value(ReduceOp op, int r, size_t i) {
  if (op == ReduceOp::kProd) return r > 0 && (i + static_cast<size_t>(r)) % 3 == 0 ? 2 : 1;
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) return static_cast<double>((r * 7 + i) % 11);
  return static_cast<double>((r + 1) * (i % 7 + 1));
}

// The closed-form reduction of value() over n ranks, as the dtype represents it.
inline double expected(ReduceOp op, DType dt, int n, size_t i) {
  double acc = value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) acc = is_float(dt) ? acc / n : std::trunc(acc / n);
  // Round through the dtype (avg of floats may need it, e.g. 31.5 in bf16 is exact).
  alignas(8) char tmp[8];
  store(dt, tmp, 0, acc);
  return load(dt, tmp, 0);
}

}  // namespace loom::comm::testing
