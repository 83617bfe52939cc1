// `loom bench train`: training throughput against the sgemm peak (MFU); and `loom bench
// gemm`'s flags (its measurements are loom/bench/bench.h's). Benchmarks, never timed tests;
// figures go to docs/perf.md.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "config.h"
#include "kernels/gemm/gemm.h"
#include "loom/bench/bench.h"
#include "loom/core/error.h"
#include "loom/core/host.h"
#include "loom/nn/gpt.h"
#include "loom/nn/step_breakdown.h"
#include "loom/optim/optim.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "config_train.h"

namespace loom::app {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A preset's model shape, as a config naming it resolves it (no data: benchmarks draw tokens).
nn::GptConfig preset_model(const std::string& preset) {
  Config c;
  c.set("model.preset", preset);
  c.set("data.train", std::string("-"));
  c.resolve();
  return gpt_config(c);
}

// `loom bench train --breakdown`'s figures of one configuration: the mean ms a step of each
// part (loom/nn/step_breakdown.h), then of what is left of the step, then of the step.
struct StepParts {
  std::string mode, precision;
  int64_t threads;
  std::array<double, nn::kStepParts + 2> ms;
  std::array<double, nn::kStepParts + 2> cpu_ms;  // the process's CPU time over the same spans
};

// The breakdown's table: a row of ms per configuration, and under each configuration whose
// thread count is not `first`, the speed-up of each part over the same recompute mode and
// precision at `first` threads (how well each part scales).
void print_breakdown(const std::vector<StepParts>& rows, int64_t first) {
  const auto columns = [] {
    std::printf("%10s %9s %8s", "recompute", "precision", "threads");
    for (int i = 0; i < nn::kStepParts; ++i) std::printf(" %10s", nn::step_part_name(static_cast<nn::StepPart>(i)));
    std::printf(" %10s %10s\n", "other", "step");
  };
  const auto row_start = [](const StepParts& r) {
    std::printf("%10s %9s %8lld", r.mode.c_str(), r.precision.c_str(), static_cast<long long>(r.threads));
  };
  std::printf("# where the step goes: ms a step (the mean of the timed steps), each part's own time; other: the step "
              "less the parts (residual adds, copies, zeroing the gradients)\n");
  columns();
  for (const StepParts& r : rows) {
    row_start(r);
    for (double ms : r.ms) std::printf(" %10.2f", ms);
    std::printf("\n");
    if (r.threads == first) continue;
    for (const StepParts& base : rows) {
      if (base.threads != first || base.mode != r.mode || base.precision != r.precision) continue;
      std::printf("%10s %9s %8s", "", "speed-up", cat(first, "->", r.threads).c_str());
      for (size_t i = 0; i < r.ms.size(); ++i) {
        if (base.ms[i] > 0.005 && r.ms[i] > 0.005)
          std::printf(" %9.2fx", base.ms[i] / r.ms[i]);
        else
          std::printf(" %10s", "-");
      }
      std::printf("\n");
    }
  }
  // How busy each part kept the pool: where it is well under 100%, threads waited (a serial
  // stretch, a barrier, one thread's larger share). Waiting threads count as busy while
  // OpenMP spins them, so run with OMP_WAIT_POLICY=passive to see the waits.
  std::printf("# threads busy: each part's CPU time (every thread's) over its wall time x threads, %%; waits count as "
              "busy while the OpenMP runtime spins (OMP_WAIT_POLICY=%s)\n",
              std::getenv("OMP_WAIT_POLICY") != nullptr ? std::getenv("OMP_WAIT_POLICY") : "unset");
  columns();
  for (const StepParts& r : rows) {
    row_start(r);
    for (size_t i = 0; i < r.ms.size(); ++i) {
      if (r.ms[i] > 0.005)
        std::printf(" %9.0f%%", 100.0 * r.cpu_ms[i] / (r.ms[i] * static_cast<double>(r.threads)));
      else
        std::printf(" %10s", "-");
    }
    std::printf("\n");
  }
}

// job.gemm_path for a benchmark (InputError when the CPU lacks the path).
void use_gemm_path(const std::string& name) {
  Config c;
  c.set("job.gemm_path", name);
  c.set("data.train", std::string("-"));
  c.resolve();
  apply_compute_settings(c);
}

// --shared-pack's mode (kernels::set_gemm_shared_pack), for the process.
void use_shared_pack(const std::string& mode) {
  kernels::set_gemm_shared_pack(mode == "on"    ? kernels::GemmSharedPack::kOn
                                : mode == "off" ? kernels::GemmSharedPack::kOff
                                                : kernels::GemmSharedPack::kAuto);
}

// The mode the products run with now, as --shared-pack names it.
const char* shared_pack_name() {
  switch (kernels::gemm_shared_pack()) {
    case kernels::GemmSharedPack::kOn: return "on";
    case kernels::GemmSharedPack::kOff: return "off";
    case kernels::GemmSharedPack::kAuto: break;
  }
  return "auto";
}

}  // namespace

int run_bench_gemm(const std::vector<int64_t>& threads, const std::string& path_name, const std::string& shared_pack) {
  check_flag_range("--threads", threads, 1, bench::kMaxBenchThreads);
  // The shapes of gpt-mini's step (8 x 256 rows) and gpt2-124m's (1024 rows).
  std::vector<bench::GemmModel> models;
  for (const auto& [preset, rows] : {std::pair{"gpt-mini", int64_t{8 * 256}}, std::pair{"gpt2-124m", int64_t{1024}}}) {
    const nn::GptConfig m = preset_model(preset);
    models.push_back({preset, m.d_model, m.vocab_size, rows});
  }
  use_gemm_path(path_name);
  use_shared_pack(shared_pack);
  std::printf("# an operand every band of a product needs packed once (--shared-pack): %s\n", shared_pack_name());
  return bench::run_bench_gemm(threads, models);
}

int run_bench_gpu(const gpu::BenchGpuArgs& a) { return gpu::run_bench_gpu(preset_model(a.preset), a); }

int run_bench_decode(const BenchDecodeArgs& a) { return bench::run_bench_decode(a, preset_model(a.preset)); }

int run_bench_train(const BenchTrainArgs& a) {
  check_flag_range("--threads", a.threads, 1, bench::kMaxBenchThreads);
  check_flag_range("--micro-batch", a.micro_batch, 1, 1 << 12);
  check_flag_range("--steps", a.steps, 1, 1 << 20);
  check_flag_range("--warmup", a.warmup, 0, 1 << 20);
  if (!(a.peak_gflops >= 0 && a.peak_gflops <= 1e9))
    throw InputError(cat("--peak-gflops = ", a.peak_gflops, ": expected a number in [0, 1e9] (0: measure it)"));
  const nn::GptConfig cfg = preset_model(a.preset);
  use_gemm_path(a.gemm_path);
  use_shared_pack(a.shared_pack);
  const int64_t b = a.micro_batch, t = cfg.seq_len;
  std::printf("# loom bench train: %s (n_layer %lld, n_head %lld, d_model %lld, seq %lld, vocab %lld), micro-batch %lld, AdamW\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
              static_cast<long long>(cfg.d_model), static_cast<long long>(t), static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(b));
  std::printf("# gemm path %s (%s); 16-bit products on %s; shared packing %s\n",
              kernels::gemm_path_name(kernels::gemm_active_path()), a.gemm_path.c_str(),
              kernels::gemm_path_name(a.gemm_path == "auto" ? kernels::gemm_best_half_path()
                                                            : kernels::gemm_active_path()),
              shared_pack_name());
  std::printf("%10s %9s %8s %12s %12s %10s %12s %8s %10s %10s %10s %10s\n", "recompute", "precision", "threads",
              "step_ms", "tokens/s", "GFLOP/s", "sgemm_peak", "mfu", "final_loss", "kept_mib", "peak_mib", "cpu_ms");
  std::vector<StepParts> parts;
  for (const std::string& mode : a.recompute)
  for (const std::string& precision : a.precision)
  for (int64_t th : a.threads) {
    // The machine is shared: the peak is the best of a measurement before and one after
    // the timed steps, so one noisy moment does not inflate MFU.
    double peak = a.peak_gflops > 0 ? a.peak_gflops : bench::sgemm_peak_gflops(static_cast<int>(th));
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
    std::vector<double> times, cpu_times;
    std::array<double, nn::kStepParts + 2> part_s{}, part_cpu_s{};  // summed over the timed steps
    nn::record_step_parts(a.breakdown);
    double loss = 0;
    for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
      for (int64_t i = 0; i < b * t; ++i) {  // random tokens, as the PyTorch peer
        x.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
        y.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
      }
      const double t0 = now_s(), c0 = process_cpu_seconds();
      gpt.params().zero_grads();
      loss = gpt.forward(x, y, ctx);
      if (s == 0) kept = ctx.arena.peak_bytes();
      gpt.backward(ctx, 1.0);
      {
        const nn::StepPartScope part(nn::StepPart::kOptimizer);
        opt->step(3e-4);
      }
      const double step_s = now_s() - t0;
      const double step_cpu_s = process_cpu_seconds() - c0;
      const std::array<double, nn::kStepParts> step_parts = nn::take_step_parts();
      const std::array<double, nn::kStepParts> step_parts_cpu = nn::take_step_parts_cpu();
      if (s >= a.warmup) {
        times.push_back(step_s);
        cpu_times.push_back(step_cpu_s);
        double left = step_s, left_cpu = step_cpu_s;
        for (size_t i = 0; i < nn::kStepParts; ++i) {
          part_s[i] += step_parts[i];
          part_cpu_s[i] += step_parts_cpu[i];
          left -= step_parts[i];
          left_cpu -= step_parts_cpu[i];
        }
        part_s[nn::kStepParts] += left;
        part_s[nn::kStepParts + 1] += step_s;
        part_cpu_s[nn::kStepParts] += left_cpu;
        part_cpu_s[nn::kStepParts + 1] += step_cpu_s;
      }
    }
    nn::record_step_parts(false);
    if (a.breakdown) {
      StepParts row{mode, precision, th, {}, {}};
      for (size_t i = 0; i < row.ms.size(); ++i) {
        row.ms[i] = part_s[i] * 1e3 / static_cast<double>(a.steps);
        row.cpu_ms[i] = part_cpu_s[i] * 1e3 / static_cast<double>(a.steps);
      }
      parts.push_back(row);
    }
    if (a.peak_gflops <= 0) peak = std::max(peak, bench::sgemm_peak_gflops(static_cast<int>(th)));
    const double step = median(times);
    const double tps = static_cast<double>(b * t) / step;
    // Model FLOPs, attention counted in full as the PyTorch peer counts it (Loom skips the
    // masked blocks, so this slightly overstates the arithmetic it really does).
    const double gflops = 3.0 * gpt.forward_flops_per_token(t) * tps / 1e9;
    const double mib = 1 << 20;
    std::printf("%10s %9s %8lld %12.1f %12.0f %10.1f %12.1f %7.1f%% %10.4f %10.1f %10.1f %10.1f\n", mode.c_str(),
                precision.c_str(), static_cast<long long>(th), step * 1e3, tps, gflops, peak, 100.0 * gflops / peak, loss,
                static_cast<double>(kept) / mib,
                static_cast<double>(ctx.arena.peak_bytes() + gpt.recompute_peak_bytes()) / mib,
                median(cpu_times) * 1e3);
    std::fflush(stdout);
  }
  if (a.breakdown) print_breakdown(parts, a.threads.front());
  return 0;
}

}  // namespace loom::app
