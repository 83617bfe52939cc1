// `loom bench decode`: the model alone under continuous batching, without HTTP or clients:
// Gpt::decode_batch over B sequences at a time, as `loom serve`'s decoding thread runs it.
// Benchmarks, never timed tests; figures go to docs/perf.md.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "config.h"
#include "loom/error.h"
#include "loom/nn/gpt.h"
#include "loom/rng.h"
#include "loom/threads.h"
#include "task.h"

namespace loom::app {

int run_bench_decode(const BenchDecodeArgs& a) {
  if (a.from < 1 || a.to <= a.from) throw InputError(cat("--from ", a.from, " --to ", a.to, ": expected 1 <= from < to"));
  for (int64_t b : a.batch)
    if (b < 1) throw InputError(cat("--batch ", b, ": expected >= 1"));
  if (a.quantize != "none" && a.quantize != "int8") throw InputError(cat("--quantize ", a.quantize, ": expected none or int8"));
  Config c;
  c.set("model.preset", a.preset);
  c.set("data.train", std::string("-"));
  c.resolve();
  const nn::GptConfig cfg = gpt_config(c);
  if (a.to > cfg.seq_len) throw InputError(cat("--to ", a.to, ": past the window (", cfg.seq_len, " positions)"));
  nn::Gpt gpt(cfg);
  gpt.init(0);  // the rate does not depend on the weights
  if (a.quantize == "int8") gpt.use_int8(gpt.quantize_int8());
  std::printf("# loom bench decode: %s (n_layer %lld, d_model %lld, vocab %lld), %s weights; each sequence decodes "
              "positions %lld..%lld and starts again with a prompt of %lld tokens (its prefill in the step); "
              "%lld steps after %lld untimed\n",
              a.preset.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.d_model),
              static_cast<long long>(cfg.vocab_size), a.quantize == "int8" ? "int8" : "f32", static_cast<long long>(a.from),
              static_cast<long long>(a.to), static_cast<long long>(a.from), static_cast<long long>(a.steps),
              static_cast<long long>(a.warmup));
  std::printf("%8s %8s %12s %12s %12s %8s\n", "threads", "batch", "step p50 ms", "step mean ms", "tokens/s", "vs first");
  for (int64_t th : a.threads) {
    set_compute_threads(static_cast<int>(th));
    double first = 0;  // tokens/s of the first batch size, for the ratio
    for (int64_t b : a.batch) {
      auto pool = std::make_shared<nn::KvPagePool>(cfg, b * nn::KvPagePool::pages_for(a.to));
      std::vector<nn::KvCache> caches;
      std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(b));
      Rng rng(7);
      for (int64_t s = 0; s < b; ++s) {
        caches.push_back(*gpt.make_cache(pool, a.to));
        // Sequences start spread over the positions, as requests arriving one by one are.
        const int64_t start = a.from + s * (a.to - a.from) / b;
        for (int64_t i = 0; i < start; ++i) tokens[s].push_back(static_cast<int32_t>(rng.below(cfg.vocab_size)));
      }
      Arena arena;
      std::vector<Arena> groups(static_cast<size_t>(th));
      std::vector<double> times;
      double total = 0;
      int64_t made = 0;
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
        if (step < a.warmup) continue;
        times.push_back(dt);
        total += dt;
        made += b;
      }
      std::sort(times.begin(), times.end());
      const double rate = static_cast<double>(made) / total;
      if (first == 0) first = rate;
      std::printf("%8lld %8lld %12.3f %12.3f %12.0f %7.2fx\n", static_cast<long long>(th), static_cast<long long>(b),
                  times[times.size() / 2] * 1e3, total / static_cast<double>(times.size()) * 1e3, rate, rate / first);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace loom::app
