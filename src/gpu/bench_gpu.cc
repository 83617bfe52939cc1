// `loom bench gpu` (loom/gpu/gpu.h): the GPU trainer's step, timed. A benchmark, never a
// timed test; figures go to docs/gpu.md with the command.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/gpu/gpu.h"

namespace loom::gpu {

int run_bench_gpu(const nn::GptConfig& cfg, const BenchGpuArgs& a) {
  if (a.micro_batch < 1 || a.steps < 1 || a.warmup < 0)
    throw InputError(cat("loom bench gpu: --micro-batch and --steps must be >= 1 and --warmup >= 0"));
  nn::Gpt model(cfg);
  model.init(0);
  GptTrainerConfig tc;
  tc.micro_batch = a.micro_batch;
  tc.device = a.device;
  tc.profile = a.profile;
  tc.attention = a.attention;
  tc.fused_epilogues = a.fused_epilogues;
  GptTrainer trainer(model, tc);  // InputError in a build without CUDA
  const double peak = a.peak_tflops > 0 ? a.peak_tflops : bf16_gemm_tflops(a.device);
  const int64_t b = a.micro_batch, t = cfg.seq_len;
  std::printf("# loom bench gpu: %s (n_layer %lld, n_head %lld, d_model %lld, seq %lld, vocab %lld), micro-batch %lld,"
              " bf16, AdamW, %s attention, on %s\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
              static_cast<long long>(cfg.d_model), static_cast<long long>(t), static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(b), gpu_attention_name(a.attention),
              device_description(a.device).c_str());
  Rng rng(1234);
  std::vector<int32_t> x(size_t(b * t)), y(size_t(b * t));
  std::vector<double> times;
  double first_loss = 0, loss = 0;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    for (size_t i = 0; i < x.size(); ++i) {  // random tokens, as the PyTorch peer
      x[i] = static_cast<int32_t>(rng.below(uint64_t(cfg.vocab_size)));
      y[i] = static_cast<int32_t>(rng.below(uint64_t(cfg.vocab_size)));
    }
    const auto t0 = std::chrono::steady_clock::now();
    loss = trainer.forward_backward(x, y);
    trainer.step(3e-4);
    trainer.synchronize();
    if (s == 0) first_loss = loss;
    if (s + 1 == a.warmup) trainer.phase_ms();  // the timed steps' phases only
    if (s >= a.warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double step = times[times.size() / 2];
  const double tps = static_cast<double>(b * t) / step;
  // Model FLOPs with the attention counted in full, as PyTorch's and nanoGPT's MFU count it.
  const double tflops = 3.0 * model.forward_flops_per_token(t) * tps / 1e12;
  const MemoryStats mem = trainer.memory();
  const double gib = double(1 << 30);
  std::printf("%10s %12s %12s %10s %10s %8s %14s %14s %16s\n", "step_ms", "best_ms", "tokens/s", "TFLOP/s",
              "bf16_peak", "mfu", "peak_in_use", "peak_reserved", "loss");
  std::printf("%10.2f %12.2f %12.0f %10.1f %10.1f %7.1f%% %10.2f GiB %10.2f GiB %8.4f->%.4f\n", step * 1e3,
              times.front() * 1e3, tps, tflops, peak, 100.0 * tflops / peak, double(mem.peak_in_use) / gib,
              double(mem.peak_reserved) / gib, first_loss, loss);
  std::printf("# epilogues: %s\n", trainer.epilogues().c_str());
  if (a.profile) {
    const auto phases = trainer.phase_ms();
    double total = 0;
    for (const auto& [name, ms] : phases) total += ms;
    std::printf("# device time per step by phase (ms, %% of %.2f ms)\n", total / double(a.steps));
    for (const auto& [name, ms] : phases)
      std::printf("%24s %9.2f %6.1f%%\n", name.c_str(), ms / double(a.steps), 100.0 * ms / total);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace loom::gpu
