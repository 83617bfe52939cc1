// The CLI's commands. Each returns the process exit code; errors are thrown as loom::Error
// and printed by main() as one line.
#pragma once

#include <string>
#include <vector>

namespace loom::app {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;  // --section.key=value
  bool resume = false;
  bool quiet = false;  // no progress; the run summary still prints
};
int run_train(const TrainArgs& a);

struct SampleArgs {
  std::string checkpoint, config, prompt;
  std::vector<std::string> overrides;
  int64_t tokens = 256, top_k = 40, seed = 1, lines = 0;
  double temperature = 0.8;
};
int run_sample(const SampleArgs& a);

struct EvalArgs {
  std::string checkpoint, data, config;
  std::vector<std::string> overrides;
  int64_t batch = 8;
};
int run_eval(const EvalArgs& a);

struct BenchTrainArgs {
  std::string preset = "gpt-mini";
  std::vector<int64_t> threads = {1, 2};
  int64_t micro_batch = 8, steps = 10, warmup = 3;
  double peak_gflops = 0;  // 0: measure the sgemm peak per thread count
};
int run_bench_train(const BenchTrainArgs& a);
int run_bench_gemm(const std::vector<int64_t>& threads);

}  // namespace loom::app
