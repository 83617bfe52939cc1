// `loom bench gemm`: Loom's GEMM beside OpenBLAS on the shapes of a GPT step, and the fused
// elementwise kernels against their two-pass forms. Benchmarks, never timed tests; figures
// go to docs/perf.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/openblas.h"
#include "kernels/gemm/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "loom/bench/bench.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"

namespace loom::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best-of GFLOP/s for C (m, n) = op(A) (m, k) op(B) (k, n) on the current backend: f32
// products (sgemm), or 16-bit ones (format kBF16 or kF16: gemm_half).
double sgemm_gflops(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int reps, DType format = DType::kF32) {
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.0f);
  Rng r(7);
  for (auto& x : a) x = static_cast<float>(r.normal());
  for (auto& x : b) x = static_cast<float>(r.normal());
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_s();
    if (format == DType::kF32)
      kernels::gemm<float>(ta, tb, m, n, k, a.data(), ta ? m : k, b.data(), tb ? k : n, false, c.data(), n);
    else
      kernels::gemm_half(format, ta, tb, m, n, k, a.data(), ta ? m : k, b.data(), tb ? k : n, false, c.data(), n);
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
std::vector<GemmShape> gpt_gemm_shapes(const GemmModel& model) {
  const std::string& preset = model.name;
  const int64_t d = model.d_model, v = model.vocab_size, rows = model.rows;
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

double sgemm_peak_gflops(int threads) { return sgemm_peak(threads); }

int run_bench_gemm(const std::vector<int64_t>& threads, const std::vector<GemmModel>& models) {
  std::vector<GemmShape> shapes = {{"square 2048", false, false, 2048, 2048, 2048}};
  for (const GemmModel& m : models)
    for (const GemmShape& s : gpt_gemm_shapes(m)) shapes.push_back(s);
  const kernels::GemmPath path = kernels::gemm_active_path();
  std::printf("# loom bench gemm: Loom's GEMM (%s micro-kernel) beside OpenBLAS (%s), best of 5 runs; GFLOP/s\n",
              kernels::gemm_path_name(path), openblas().corename());
  for (int64_t t : threads) {
    const int th = static_cast<int>(t);
    set_compute_threads(th);
    const double peak = kernels::fma_peak_gflops(path, th);
    // bf16 products on the active path, against the peak of its bf16 instruction where it
    // has one (vdpbf16ps, or AMX's tdpbf16ps).
    const bool dot = path == kernels::GemmPath::kAvx512Bf16 || path == kernels::GemmPath::kAmx;
    const double bf16_peak = kernels::half_peak_gflops(path, th);
    std::printf("\n# %d thread(s): FMA peak %.1f GFLOP/s (%s, measured now); bf16 peak %.1f GFLOP/s (%s)\n", th, peak,
                kernels::gemm_path_name(path), bf16_peak,
                !dot ? "the FMA's" : path == kernels::GemmPath::kAmx ? "tdpbf16ps, measured now" : "vdpbf16ps, measured now");
    std::printf("%-28s %2s %6s %6s %6s %9s %9s %7s %9s %9s %9s %7s\n", "shape", "op", "M", "N", "K", "loom", "openblas",
                "ratio", "%peak", "bf16", "%peak", "x f32");
    for (const GemmShape& s : shapes) {
      const int reps = 2.0 * s.m * s.n * s.k > 2e10 ? 3 : 5;
      kernels::set_gemm_backend(kernels::GemmBackend::kOpenBlas);
      const double blas = sgemm_gflops(s.ta, s.tb, s.m, s.n, s.k, reps);
      kernels::set_gemm_backend(kernels::GemmBackend::kLoom);
      const double loom = sgemm_gflops(s.ta, s.tb, s.m, s.n, s.k, reps);
      const double half = sgemm_gflops(s.ta, s.tb, s.m, s.n, s.k, reps, DType::kBF16);
      std::printf("%-28s %c%c %6lld %6lld %6lld %9.1f %9.1f %6.2fx %8.1f%% %9.1f %8.1f%% %6.2fx\n", s.name.c_str(),
                  s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', static_cast<long long>(s.m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k), loom, blas, loom / blas, 100.0 * loom / peak, half, 100.0 * half / bf16_peak,
                  half / loom);
      std::fflush(stdout);
    }
    // Fewer passes over memory (issue 12, item 3): the same product with its GELU.
    std::printf("%-28s %6s %6s %12s %12s %7s\n", "fused elementwise", "rows", "d", "two passes", "fused", "saved");
    for (const GemmModel& m : models) {
      const std::string& preset = m.name;
      const int64_t rows = m.rows, width = m.d_model;
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

}  // namespace loom::bench
