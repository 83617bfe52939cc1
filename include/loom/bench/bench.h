// The measurements `loom bench comm`, `loom bench serve` and `loom bench gemm` run
// (docs/perf.md): each takes its command's flags, checks them (InputError naming the flag)
// and prints its table.
// Benchmarks, never timed tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/nn/gpt_config.h"

namespace loom::bench {

// The most threads a benchmark may ask for.
inline constexpr int64_t kMaxBenchThreads = 1024;

// `loom bench comm`: nccl-tests style collectives over the job this process is a rank of
// (started by `loom launch -n N`, mpirun or torchrun).
struct BenchCommArgs {
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  std::string sizes = "8:256M";
  double factor = 2;  // size step (nccl-tests -f)
  int iters = 0;      // 0: calibrate to ~0.1 s per rep (as bench/peers)
  int min_iters = 1;  // calibrated calls per rep never fewer
  int warmup = 5;
  int reps = 5;
  std::string dtype = "f32";
  std::string transport = "auto";
  std::string algorithm = "auto";
  int64_t shm_slot_bytes = 1 << 20;  // CommConfig::shm_slot_bytes
  bool check = true;
  bool fingerprints = true;  // CommConfig::check_fingerprints
  // Each call first writes every 64-byte line of its input (the same bytes back), as a
  // backward pass writes a gradient just before its all-reduce; timed with the call.
  bool dirty_inputs = false;
  // Inputs in memory the same-host peers map (Communicator::alloc_shared), so that
  // all_reduce and all_gather read them in place instead of through the shared window.
  bool shared_inputs = false;
  // Both: each size's reps alternate between an ordinary and a shared input, so that the
  // host's drift falls on both alike; a row for each and their ratio.
  bool ab_shared = false;
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

// `loom bench decode`: the model alone under continuous batching, without HTTP or clients:
// Gpt::decode_batch (or decode_grouped) over B sequences at a time, as `loom serve`'s
// decoding lanes run it; `model` is the preset's shape (the weights are random).
struct BenchDecodeArgs {
  std::string preset = "gpt-mini";
  std::vector<int64_t> batch = {1, 4, 16};  // sequences decoded together
  std::vector<int64_t> threads = {1, 2};
  int64_t from = 10, to = 74;  // positions each sequence decodes, then starts again
  int64_t steps = 2000, warmup = 100;
  std::string quantize = "none";  // or int8
  bool grouped = false;            // Gpt::decode_grouped: a group of sequences per thread
  int64_t lanes = 1;               // decoding threads, each its share of the batch and of the threads
  bool plain = false;              // f32 weights in place, not in panels (Gpt::use_panels)
  std::string kv_cache_dtype = "f32";  // or bf16
};
int run_bench_decode(const BenchDecodeArgs& a, const nn::GptConfig& model);

// `loom bench gemm`: Loom's GEMM (the path already set, kernels::set_gemm_path) beside
// OpenBLAS on a square product and every GEMM of each model's training step, and the fused
// elementwise kernels against their two passes, for each thread count.
struct GemmModel {
  std::string name;  // a preset's, for the table
  int64_t d_model = 0, vocab_size = 0;
  int64_t rows = 0;  // micro-batch x seq_len
};
int run_bench_gemm(const std::vector<int64_t>& threads, const std::vector<GemmModel>& models);

// The peak MFU is measured against: the best of large square sgemm on `threads` threads
// (the compute pool is sized to them).
double sgemm_peak_gflops(int threads);

}  // namespace loom::bench
