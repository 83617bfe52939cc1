// `loom bench decode`: the model alone under continuous batching, without HTTP or clients:
// Gpt::decode_batch (or decode_grouped) over B sequences at a time, as `loom serve`'s decoding
// lanes run it.
// Benchmarks, never timed tests; figures go to docs/perf.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

#include "loom/bench/bench.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"
#include "loom/nn/gpt.h"
#include "loom/serve/gpt_loading.h"

namespace loom::bench {

namespace {

// One lane: `b` sequences stepped together `warmup + steps` times; the timed steps' seconds.
std::vector<double> run_lane(const nn::Gpt& gpt, const BenchDecodeArgs& a, int64_t b, int threads, uint64_t seed) {
  set_compute_threads(threads);  // this thread's own team
  const nn::GptConfig& cfg = gpt.config();
  auto pool =
      std::make_shared<nn::KvPagePool>(cfg, b * nn::KvPagePool::pages_for(a.to), serve::kv_cache_dtype_named(a.kv_cache_dtype));
  std::vector<nn::KvCache> caches;
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(b));
  Rng rng(seed);
  for (int64_t s = 0; s < b; ++s) {
    caches.push_back(*gpt.make_cache(pool, a.to));
    // Sequences start spread over the positions, as requests arriving one by one are.
    const int64_t start = a.from + s * (a.to - a.from) / b;
    for (int64_t i = 0; i < start; ++i) tokens[s].push_back(static_cast<int32_t>(rng.below(cfg.vocab_size)));
  }
  Arena arena;
  std::vector<Arena> groups(static_cast<size_t>(threads));
  std::vector<double> times;
  for (int64_t step = 0; step < a.warmup + a.steps; ++step) {
    std::vector<std::span<const int32_t>> rows;
    std::vector<nn::KvCache*> ptrs;
    for (int64_t s = 0; s < b; ++s) {
      if (caches[s].length >= a.to - 1) {  // finished: a new request of `from` tokens takes its place
        caches[s].length = 0;
        tokens[s].resize(static_cast<size_t>(a.from));
      }
      const int64_t n = caches[s].next_rows(static_cast<int64_t>(tokens[s].size()));
      rows.push_back(std::span<const int32_t>(tokens[s]).last(static_cast<size_t>(n)));
      ptrs.push_back(&caches[s]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = a.grouped ? gpt.decode_grouped(rows, ptrs, groups, arena) : gpt.decode_batch(rows, ptrs, arena);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t s = 0; s < b; ++s)  // the next token: any id will do
      tokens[s].push_back(static_cast<int32_t>(rng.below(cfg.vocab_size)));
    if (step >= a.warmup) times.push_back(dt);
  }
  return times;
}

}  // namespace

int run_bench_decode(const BenchDecodeArgs& a, const nn::GptConfig& cfg) {
  if (a.from < 1 || a.to <= a.from) throw InputError(cat("--from ", a.from, " --to ", a.to, ": expected 1 <= from < to"));
  if (a.lanes < 1 || a.lanes > 256) throw InputError(cat("--lanes ", a.lanes, ": expected 1 to 256"));
  check_flag_range("--batch", a.batch, 1, 1 << 12);
  check_flag_range("--threads", a.threads, 1, kMaxBenchThreads);
  check_flag_range("--steps", a.steps, 1, 1 << 24);
  check_flag_range("--warmup", a.warmup, 0, 1 << 24);
  if (a.quantize != "none" && a.quantize != "int8") throw InputError(cat("--quantize ", a.quantize, ": expected none or int8"));
  serve::kv_cache_dtype_named(a.kv_cache_dtype);
  if (a.to > cfg.seq_len) throw InputError(cat("--to ", a.to, ": past the window (", cfg.seq_len, " positions)"));
  nn::Gpt gpt(cfg);
  gpt.init(0);  // the rate does not depend on the weights
  if (a.quantize == "int8") gpt.use_int8(gpt.quantize_int8());
  if (a.quantize != "int8" && !a.plain) gpt.use_panels();
  std::printf("# loom bench decode: %s (n_layer %lld, d_model %lld, vocab %lld), %s weights; each sequence decodes "
              "positions %lld..%lld and starts again with a prompt of %lld tokens (its prefill in the step); "
              "%lld steps after %lld untimed; keys and values in %s%s\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.d_model),
              static_cast<long long>(cfg.vocab_size), a.quantize == "int8" ? "int8" : a.plain ? "f32 (in place)" : "f32 (in panels)", static_cast<long long>(a.from),
              static_cast<long long>(a.to), static_cast<long long>(a.from), static_cast<long long>(a.steps),
              static_cast<long long>(a.warmup), a.kv_cache_dtype.c_str(),
              a.lanes > 1 ? cat("; ", a.lanes, " lanes side by side, each its share of the batch and threads").c_str() : "");
  std::printf("%8s %8s %12s %12s %12s %8s\n", "threads", "batch", "step p50 ms", "step mean ms", "tokens/s", "vs first");
  for (int64_t th : a.threads) {
    double first = 0;  // tokens/s of the first batch size, for the ratio
    for (int64_t b : a.batch) {
      // Lane l steps its share of the b sequences; the rate is all lanes' tokens over the
      // slowest lane's time (with one lane, its own).
      std::vector<std::vector<double>> lane_times(static_cast<size_t>(a.lanes));
      std::vector<std::thread> lanes;
      const int threads = static_cast<int>(std::max<int64_t>(1, th / a.lanes));
      for (int64_t l = 0; l < a.lanes; ++l) {
        const int64_t share = b / a.lanes + (l < b % a.lanes ? 1 : 0);
        if (share == 0) continue;  // fewer sequences than lanes: the others idle, as the server's do
        lanes.emplace_back([&, l, share] { lane_times[l] = run_lane(gpt, a, share, threads, 7 + static_cast<uint64_t>(l)); });
      }
      for (std::thread& t : lanes) t.join();
      std::vector<double> times;
      double slowest = 0;
      for (const auto& lt : lane_times) {
        times.insert(times.end(), lt.begin(), lt.end());
        slowest = std::max(slowest, std::accumulate(lt.begin(), lt.end(), 0.0));
      }
      std::sort(times.begin(), times.end());
      const double total = std::accumulate(times.begin(), times.end(), 0.0);
      const double rate = static_cast<double>(b * a.steps) / slowest;  // every lane steps a.steps times
      if (first == 0) first = rate;
      std::printf("%8lld %8lld %12.3f %12.3f %12.0f %7.2fx\n", static_cast<long long>(th), static_cast<long long>(b),
                  times[times.size() / 2] * 1e3, total / static_cast<double>(times.size()) * 1e3, rate, rate / first);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace loom::bench
