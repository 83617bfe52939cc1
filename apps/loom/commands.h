// The CLI's commands. Each returns the process exit code; errors are thrown as loom::Error
// and printed by main() as one line.
#pragma once

#include <string>
#include <vector>

#include "loom/bench/bench.h"
#include "loom/gpu/gpu.h"
#include "loom/launch/launch.h"
#include "loom/serve/completion_server.h"
#include "loom/train/train.h"

namespace loom::app {

// `loom train`: the run's flags (train::RunOptions), the config and its overrides.
struct TrainArgs : train::RunOptions {
  std::string config;
  std::vector<std::string> overrides;  // --section.key=value
  bool dry_run = false;  // check the config and print the memory plan; load and write nothing
};
int run_train(const TrainArgs& a);

struct SampleArgs {
  std::string checkpoint, config, prompt, tokenizer;  // tokenizer "": the checkpoint's
  std::vector<std::string> overrides;
  int64_t tokens = 256, top_k = 40, seed = 1, lines = 0;
  double temperature = 0.8, top_p = 1.0;
  bool kv_cache = true;  // false: the whole window's forward for every token
  std::string quantize = "none";  // none | int8
};
int run_sample(const SampleArgs& a);

// `loom serve`: the server's options, and a config for the model shape of a bare
// safetensors file (n_head) with its overrides.
struct ServeArgs : serve::ServerOptions {
  std::string config;
  std::vector<std::string> overrides;
};
int run_serve(const ServeArgs& a);

struct EvalArgs {
  std::string checkpoint, data, config, tokenizer;
  std::vector<std::string> overrides;
  int64_t batch = 8;
  std::string quantize = "none";  // none | int8
};
int run_eval(const EvalArgs& a);

struct PruneArgs {
  std::string checkpoint, out, config;
  std::vector<std::string> overrides;
  double sparsity = 0.5;
  std::string structured = "none";  // none | rows | heads
};
struct QuantizeArgs {
  std::string checkpoint, out, config;
  std::vector<std::string> overrides;
};
// `loom quantize`: a GPT's linear weights and tied embedding to int8 (per output channel)
// into a new checkpoint.
int run_quantize(const QuantizeArgs& a);

// `loom prune`: magnitude pruning of a GPT's linear layers into a new checkpoint.
int run_prune(const PruneArgs& a);

struct CkptArgs {
  std::string action;  // verify | inspect | export
  std::string path, out;
  std::string format = "safetensors";  // export: safetensors | onnx
  std::vector<std::string> overrides;  // export --format onnx of a bare file: --model.n_head=N
};
// `loom ckpt`: check, describe or export a checkpoint (docs/formats.md).
int run_ckpt(const CkptArgs& a);

struct TokenizerArgs {
  std::string action;                // train | encode | decode
  std::vector<std::string> sources;  // train: text:PATH...
  std::string tokenizer = "bytes";   // encode, decode: a tokenizer spec (data::Tokenizer::load)
  std::string file = "-";            // encode, decode: the input ("-": standard input)
  std::string out;                   // train: the directory for encoder.json and vocab.bpe
  int64_t vocab_size = 4096, min_frequency = 2, repeat = 1;
  bool stats = false;  // encode: print bytes, ids and MB/s (JSON, stderr) instead of the ids
};
// `loom tokenizer`: train a byte-level BPE, or encode and decode with any tokenizer.
int run_tokenizer(const TokenizerArgs& a);

struct DataPrepareArgs {
  std::vector<std::string> sources;
  std::string out, tokenizer = "bytes";
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000, threads = 0;
  bool sharded = false;  // --shard-tokens given
};
// `loom data prepare`: text files into a token file and its validation file.
int run_data_prepare(const DataPrepareArgs& a);

struct DataFetchArgs {
  std::string manifest, cache_dir;  // cache_dir "": default_cache_dir() (config_train.h)
  double cache_mb = 10240;
  int64_t retries = 5;
};
// `loom data fetch`: every shard of a manifest checked, remote ones downloaded into the
// cache first (a cache warmed before a job starts).
int run_data_fetch(const DataFetchArgs& a);

// Whether `host` is this machine's loopback (127.0.0.1, localhost, ::1): a server anywhere
// else needs an API key (loom serve, metrics.port).
bool loopback(const std::string& host);

struct ReportArgs {
  std::vector<std::string> runs;  // run directories
  std::string out;                // "": RUN/report.html for one run, report.html for several
  double price_per_hour = 0, peak_gflops = 0;
};
// `loom report`: one self-contained HTML page about the runs (docs/observability.md).
int run_report(const ReportArgs& a);

struct BenchTrainArgs {
  std::string preset = "gpt-mini";
  std::vector<int64_t> threads = {1, 2};
  int64_t micro_batch = 8, steps = 10, warmup = 3;
  double peak_gflops = 0;  // 0: measure the sgemm peak per thread count
  std::vector<std::string> recompute = {"none"};  // activation recompute modes to run
  std::vector<std::string> precision = {"fp32"};  // [training] precision formats to run
  std::string gemm_path = "auto";                  // job.gemm_path
  std::string shared_pack = "auto";                // kernels::set_gemm_shared_pack: auto, on, off
  bool breakdown = false;  // also where the step goes (loom/nn/step_breakdown.h), part by part
};
int run_bench_train(const BenchTrainArgs& a);
int run_bench_gemm(const std::vector<int64_t>& threads, const std::string& path, const std::string& shared_pack);
// `loom bench gpu`: resolves the preset and runs loom/gpu/gpu.h's benchmark.
int run_bench_gpu(const gpu::BenchGpuArgs& a);

// loom/bench/bench.h's; run_bench_decode resolves the preset and calls bench::'s.
using bench::BenchCommArgs, bench::BenchDecodeArgs, bench::BenchServeArgs, bench::run_bench_comm, bench::run_bench_serve;
int run_bench_decode(const BenchDecodeArgs& a);

struct PlanArgs {
  int pp = 2;
  int microbatches = 8;
  std::string schedule = "1f1b";  // a schedule name, or "all" for a comparison table
  int virtual_stages = 1;
  double forward_ms = 1, backward_ms = 2, backward_input_ms = 0, backward_weight_ms = 0;
  double transfer_ms = 0, activation_mb = 1;
  double overhead_ms = 0;  // per action: the executor's time outside compute and waits
  int width = 100;
  std::string svg;  // where to write the picture; empty: none
  std::string config;  // measure each stage's costs for this training config instead
};
// `loom plan`: the pipeline simulator (loom/parallel/schedule.h) from the command line.
int run_plan(const PlanArgs& a);

using launch::LaunchArgs, launch::run_launch;  // loom/launch/launch.h

}  // namespace loom::app
