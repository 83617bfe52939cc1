// The measurements `loom bench comm` and `loom bench serve` run (docs/perf.md): each takes
// its command's flags, checks them (InputError naming the flag) and prints its table.
// Benchmarks, never timed tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::bench {

// `loom bench comm`: nccl-tests style collectives over the job this process is a rank of
// (started by `loom launch -n N`, mpirun or torchrun).
struct BenchCommArgs {
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  std::string sizes = "8:256M";
  double factor = 2;  // size step (nccl-tests -f)
  int iters = 0;      // 0: calibrate to ~0.1 s per rep (as ../shared/peers)
  int warmup = 5;
  int reps = 5;
  std::string dtype = "f32";
  std::string transport = "auto";
  std::string algorithm = "auto";
  int64_t shm_slot_bytes = 1 << 20;  // CommConfig::shm_slot_bytes
  bool check = true;
  bool fingerprints = true;  // CommConfig::check_fingerprints
};
int run_bench_comm(const BenchCommArgs& a);

// `loom bench serve`: streaming clients against a running `loom serve`.
struct BenchServeArgs {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string model = "mini";
  std::vector<int64_t> clients = {1, 4, 16, 64};  // concurrent streaming clients, one run each
  int64_t requests = 4, tokens = 64;              // completions per client, tokens per completion
  std::string prompt = "Q: what is";
  double temperature = 0.8;
  bool keep_alive = false;  // each client one connection for all its requests, as pooling clients do
};
int run_bench_serve(const BenchServeArgs& a);

}  // namespace loom::bench
