// `loom bench train` and `loom bench gemm`: training throughput and the sgemm peak it is
// measured against (MFU). Benchmarks, never timed tests; figures go to docs/perf.md.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "config.h"
#include "kernels/matmul.h"
#include "loom/nn/gpt.h"
#include "loom/optim.h"
#include "loom/rng.h"
#include "loom/threads.h"
#include "task.h"

namespace loom::app {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best-of sgemm GFLOP/s for C (m, n) = A (m, k) B (k, n).
double sgemm_gflops(int64_t m, int64_t n, int64_t k, int reps) {
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n, 0.0f);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    double t0 = now_s();
    kernels::gemm<float>(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    double dt = now_s() - t0;
    best = std::max(best, 2.0 * m * n * k / dt / 1e9);
  }
  return best;
}

// The peak Loom's MFU is measured against: the best of large square sgemm.
double sgemm_peak(int threads) {
  set_compute_threads(threads);
  return std::max(sgemm_gflops(2048, 2048, 2048, 5), sgemm_gflops(4096, 4096, 1024, 3));
}

}  // namespace

int run_bench_gemm(const std::vector<int64_t>& threads) {
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{"square 1024", 1024, 1024, 1024}, {"square 2048", 2048, 2048, 2048},
                          {"gpt-mini qkv 2048x768x256", 2048, 768, 256}, {"gpt-mini fc 2048x1024x256", 2048, 1024, 256},
                          {"gpt-mini proj 2048x256x1024", 2048, 256, 1024}};
  std::printf("%-30s %8s %10s\n", "shape (M x N x K)", "threads", "GFLOP/s");
  for (int64_t t : threads) {
    set_compute_threads(static_cast<int>(t));
    for (const auto& s : shapes)
      std::printf("%-30s %8lld %10.1f\n", s.name, static_cast<long long>(t), sgemm_gflops(s.m, s.n, s.k, 5));
  }
  return 0;
}

int run_bench_train(const BenchTrainArgs& a) {
  Config c;
  c.set("model.preset", a.preset);
  c.set("data.train", std::string("-"));
  c.resolve();
  const nn::GptConfig cfg = gpt_config(c);
  const int64_t b = a.micro_batch, t = cfg.seq_len;
  std::printf("# loom bench train: %s (n_layer %lld, n_head %lld, d_model %lld, seq %lld, vocab %lld), micro-batch %lld, fp32, AdamW\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
              static_cast<long long>(cfg.d_model), static_cast<long long>(t), static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(b));
  std::printf("%8s %12s %12s %10s %12s %8s %10s\n", "threads", "step_ms", "tokens/s", "GFLOP/s", "sgemm_peak", "mfu", "final_loss");
  for (int64_t th : a.threads) {
    // The machine is shared: the peak is the best of a measurement before and one after
    // the timed steps, so one noisy moment does not inflate MFU.
    double peak = a.peak_gflops > 0 ? a.peak_gflops : sgemm_peak(static_cast<int>(th));
    set_compute_threads(static_cast<int>(th));
    nn::Gpt gpt(cfg);
    gpt.init(0);
    auto opt = optim::make_optimizer({}, gpt.params());
    nn::GptCtx ctx;
    Rng rng(1234);
    Tensor x = Tensor::zeros({b, t}, DType::kI32), y = Tensor::zeros({b, t}, DType::kI32);
    std::vector<double> times;
    double loss = 0;
    for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
      for (int64_t i = 0; i < b * t; ++i) {  // random tokens, as the PyTorch peer
        x.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
        y.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
      }
      double t0 = now_s();
      gpt.params().zero_grads();
      loss = gpt.forward(x, y, ctx);
      gpt.backward(ctx, 1.0);
      opt->step(3e-4);
      if (s >= a.warmup) times.push_back(now_s() - t0);
    }
    if (a.peak_gflops <= 0) peak = std::max(peak, sgemm_peak(static_cast<int>(th)));
    const double step = median(times);
    const double tps = static_cast<double>(b * t) / step;
    // Model FLOPs, attention counted in full as the PyTorch peer counts it (Loom skips the
    // masked blocks, so this slightly overstates the arithmetic it really does).
    const double gflops = 3.0 * gpt.forward_flops_per_token(t) * tps / 1e9;
    std::printf("%8lld %12.1f %12.0f %10.1f %12.1f %7.1f%% %10.4f\n", static_cast<long long>(th), step * 1e3, tps,
                gflops, peak, 100.0 * gflops / peak, loss);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::app
