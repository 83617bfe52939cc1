// `loom bench train` and `loom bench gemm`: training throughput and the sgemm peak it is
// measured against (MFU). Benchmarks, never timed tests; figures go to docs/perf.md.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "config.h"
#include "kernels/gemm/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "loom/core/error.h"
#include "loom/nn/gpt.h"
#include "loom/optim/optim.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "workload.h"

namespace loom::app {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best-of sgemm GFLOP/s for C (m, n) = op(A) (m, k) op(B) (k, n) on the current backend.
double sgemm_gflops(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int reps) {
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.0f);
  Rng r(7);
  for (auto& x : a) x = static_cast<float>(r.normal());
  for (auto& x : b) x = static_cast<float>(r.normal());
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    kernels::gemm<float>(ta, tb, m, n, k, a.data(), ta ? m : k, b.data(), tb ? k : n, false, c.data(), n);
    double dt = now_s() - t0;
    best = std::max(best, 2.0 * m * n * k / dt / 1e9);
  }
  return best;
}

// The MLP's first projection and its GELU (rows x d -> rows x 4d): best ms of `reps` runs,
// as two passes (the product, then gelu_forward over it) or fused (the GELU in the GEMM's
// epilogue, tile by tile).
double fc_gelu_ms(int64_t rows, int64_t d, bool fused, int reps) {
  const int64_t h = 4 * d;
  std::vector<float> x(rows * d), w(d * h), bias(h), out(rows * h), act(rows * h);
  Rng r(7);
  for (auto* v : {&x, &w, &bias})
    for (auto& e : *v) e = static_cast<float>(0.1 * r.normal());
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    kernels::matmul_forward(out.data(), x.data(), w.data(), bias.data(), rows, d, h, kernels::WeightLayout::kKM,
                            fused ? act.data() : nullptr);
    if (!fused) kernels::gelu_forward(act.data(), out.data(), rows * h);
    best = std::min(best, (now_s() - t0) * 1e3);
  }
  return best;
}

// The residual add and the LayerNorm after it (rows x d): best ms of `reps` runs, as two
// passes (add_forward, then layernorm_forward) or fused (one pass over the rows).
double add_layernorm_ms(int64_t rows, int64_t d, bool fused, int reps) {
  std::vector<float> x(rows * d), r(rows * d), w(d, 1.0f), b(d, 0.0f), y(rows * d), mean(rows), rstd(rows);
  Rng g(7);
  for (auto* v : {&x, &r})
    for (auto& e : *v) e = static_cast<float>(g.normal());
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    if (fused) {
      kernels::add_layernorm_forward(x.data(), r.data(), y.data(), mean.data(), rstd.data(), w.data(), b.data(), rows, d);
    } else {
      kernels::add_forward(x.data(), x.data(), r.data(), rows * d);
      kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d);
    }
    best = std::min(best, (now_s() - t0) * 1e3);
  }
  return best;
}

// The peak Loom's MFU is measured against: the best of large square sgemm.
double sgemm_peak(int threads) {
  set_compute_threads(threads);
  return std::max(sgemm_gflops(false, false, 2048, 2048, 2048, 5), sgemm_gflops(false, false, 4096, 4096, 1024, 3));
}

struct GemmShape {
  std::string name;
  bool ta, tb;
  int64_t m, n, k;
};

// Every distinct GEMM of one GPT training step with `rows` = micro-batch x seq_len rows:
// forward (NN; the tied head NT), input gradients (NT; head NN) and weight gradients (TN).
// The per-head attention products are not here (their own kernel).
std::vector<GemmShape> gpt_gemm_shapes(const std::string& preset, int64_t rows) {
  Config c;
  c.set("model.preset", preset);
  c.set("data.train", std::string("-"));
  c.resolve();
  const int64_t d = c.i("model.d_model"), v = c.i("model.vocab_size");
  struct Linear {
    const char* name;
    int64_t k, m;
  };
  const Linear linears[] = {{"qkv", d, 3 * d}, {"attn.proj", d, d}, {"fc", d, 4 * d}, {"fc.proj", 4 * d, d}};
  std::vector<GemmShape> out;
  for (const Linear& l : linears) {
    out.push_back({cat(preset, " ", l.name, " fwd"), false, false, rows, l.m, l.k});
    out.push_back({cat(preset, " ", l.name, " dinp"), false, true, rows, l.k, l.m});
    out.push_back({cat(preset, " ", l.name, " dw"), true, false, l.k, l.m, rows});
  }
  out.push_back({cat(preset, " head fwd"), false, true, rows, v, d});
  out.push_back({cat(preset, " head dinp"), false, false, rows, d, v});
  out.push_back({cat(preset, " head dw"), true, false, v, d, rows});
  return out;
}

}  // namespace

int run_bench_gemm(const std::vector<int64_t>& threads, const std::string& path_name) {
  check_flag_range("--threads", threads, 1, kMaxBenchThreads);
  std::vector<GemmShape> shapes = {{"square 2048", false, false, 2048, 2048, 2048}};
  for (const GemmShape& s : gpt_gemm_shapes("gpt-mini", 8 * 256)) shapes.push_back(s);
  for (const GemmShape& s : gpt_gemm_shapes("gpt2-124m", 1024)) shapes.push_back(s);
  Config c;
  c.set("job.gemm_path", path_name);
  c.set("data.train", std::string("-"));
  c.resolve();
  apply_compute_settings(c);  // InputError when the CPU lacks the path
  const kernels::GemmPath path = kernels::gemm_active_path();
  std::printf("# loom bench gemm: Loom's GEMM (%s micro-kernel) beside OpenBLAS (%s), best of 5 runs; GFLOP/s\n",
              kernels::gemm_path_name(path), openblas_get_corename());
  for (int64_t t : threads) {
    const int th = static_cast<int>(t);
    set_compute_threads(th);
    const double peak = kernels::fma_peak_gflops(path, th);
    std::printf("\n# %d thread(s): FMA peak %.1f GFLOP/s (%s, measured now)\n", th, peak, kernels::gemm_path_name(path));
    std::printf("%-28s %2s %6s %6s %6s %9s %9s %7s %9s\n", "shape", "op", "M", "N", "K", "loom", "openblas", "ratio", "%peak");
    for (const GemmShape& s : shapes) {
      const int reps = 2.0 * s.m * s.n * s.k > 2e10 ? 3 : 5;
      kernels::set_gemm_backend(kernels::GemmBackend::kOpenBlas);
      const double blas = sgemm_gflops(s.ta, s.tb, s.m, s.n, s.k, reps);
      kernels::set_gemm_backend(kernels::GemmBackend::kLoom);
      const double loom = sgemm_gflops(s.ta, s.tb, s.m, s.n, s.k, reps);
      std::printf("%-28s %c%c %6lld %6lld %6lld %9.1f %9.1f %6.2fx %8.1f%%\n", s.name.c_str(), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N',
                  static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), loom, blas, loom / blas,
                  100.0 * loom / peak);
      std::fflush(stdout);
    }
    // Fewer passes over memory (issue 12, item 3): the same product with its GELU.
    std::printf("%-28s %6s %6s %12s %12s %7s\n", "fused elementwise", "rows", "d", "two passes", "fused", "saved");
    for (const auto& [preset, rows] : {std::pair{"gpt-mini", int64_t{8 * 256}}, std::pair{"gpt2-124m", int64_t{1024}}}) {
      Config pc;
      pc.set("model.preset", std::string(preset));
      pc.set("data.train", std::string("-"));
      pc.resolve();
      const int64_t width = pc.i("model.d_model");
      for (const bool ln : {false, true}) {
        const double apart = ln ? add_layernorm_ms(rows, width, false, 21) : fc_gelu_ms(rows, width, false, 7);
        const double fused = ln ? add_layernorm_ms(rows, width, true, 21) : fc_gelu_ms(rows, width, true, 7);
        std::printf("%-28s %6lld %6lld %9.2f ms %9.2f ms %6.1f%%\n", cat(preset, ln ? " residual + LN" : " c_fc + GELU").c_str(),
                    static_cast<long long>(rows), static_cast<long long>(width), apart, fused, 100.0 * (apart - fused) / apart);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

int run_bench_train(const BenchTrainArgs& a) {
  check_flag_range("--threads", a.threads, 1, kMaxBenchThreads);
  check_flag_range("--micro-batch", a.micro_batch, 1, 1 << 12);
  check_flag_range("--steps", a.steps, 1, 1 << 20);
  check_flag_range("--warmup", a.warmup, 0, 1 << 20);
  if (!(a.peak_gflops >= 0 && a.peak_gflops <= 1e9))
    throw InputError(cat("--peak-gflops = ", a.peak_gflops, ": expected a number in [0, 1e9] (0: measure it)"));
  Config c;
  c.set("model.preset", a.preset);
  c.set("data.train", std::string("-"));
  c.resolve();
  const nn::GptConfig cfg = gpt_config(c);
  const int64_t b = a.micro_batch, t = cfg.seq_len;
  std::printf("# loom bench train: %s (n_layer %lld, n_head %lld, d_model %lld, seq %lld, vocab %lld), micro-batch %lld, AdamW\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
              static_cast<long long>(cfg.d_model), static_cast<long long>(t), static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(b));
  std::printf("%10s %9s %8s %12s %12s %10s %12s %8s %10s %10s %10s\n", "recompute", "precision", "threads", "step_ms",
              "tokens/s", "GFLOP/s", "sgemm_peak", "mfu", "final_loss", "kept_mib", "peak_mib");
  for (const std::string& mode : a.recompute)
  for (const std::string& precision : a.precision)
  for (int64_t th : a.threads) {
    // The machine is shared: the peak is the best of a measurement before and one after
    // the timed steps, so one noisy moment does not inflate MFU.
    double peak = a.peak_gflops > 0 ? a.peak_gflops : sgemm_peak(static_cast<int>(th));
    set_compute_threads(static_cast<int>(th));
    nn::Gpt gpt(cfg);
    gpt.init(0);
    gpt.set_recompute(nn::recompute_named(mode));
    gpt.set_precision(precision_format(precision));
    auto opt = optim::make_optimizer({}, gpt.params());
    size_t kept = 0;  // activation bytes forward leaves for backward (the first, fresh, step)
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
      if (s == 0) kept = ctx.arena.peak_bytes();
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
    const double mib = 1 << 20;
    std::printf("%10s %9s %8lld %12.1f %12.0f %10.1f %12.1f %7.1f%% %10.4f %10.1f %10.1f\n", mode.c_str(),
                precision.c_str(), static_cast<long long>(th), step * 1e3, tps, gflops, peak, 100.0 * gflops / peak, loss,
                static_cast<double>(kept) / mib,
                static_cast<double>(ctx.arena.peak_bytes() + gpt.recompute_peak_bytes()) / mib);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::app
