// How fast GemmPath::kAmx's packers lay operands out (src/kernels/gemm/amx.h), on any CPU:
// the packing is plain C++ plus SSE, so its cost is measured here even where no AMX kernel
// can run. Shapes are a gpt-mini step's: op(A) transposed (the weight gradients' activations,
// stored k x m) and not, op(B) transposed (the forward's weights, stored n x k) and not, from
// f32 values and from bf16 bits; in cache (256 x 256) and from memory (1024 x 1024).
//   build/release/bench/gemm_packing_bench [--benchmark_repetitions=5]
// Reports ns per packed value (the `ns_per_value` counter).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm/amx.h"

namespace {

using loom::kernels::gemm_detail::AmxPacking;
using loom::kernels::gemm_detail::Operand;

// Normal values of every sign around 1 (the packers' cost does not depend on them).
template <typename Value>
std::vector<Value> operand(int64_t count) {
  std::vector<Value> v(static_cast<size_t>(count));
  uint32_t state = 12345;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    const uint32_t bits = (state & 0x807fffffu) | 0x3f000000u;  // [0.5, 1) and its negatives
    if constexpr (sizeof(Value) == 4) {
      std::memcpy(&x, &bits, 4);
    } else {
      x = static_cast<Value>(bits >> 16);
    }
  }
  return v;
}

// range(0): the square side (m = k for A, n = k for B); range(1): transposed.
template <typename Value>
void pack_a(benchmark::State& state) {
  const int64_t side = state.range(0), kc = side;
  const bool trans = state.range(1) != 0;
  const std::vector<Value> a = operand<Value>(side * side);
  const int64_t stride = AmxPacking::a_stride((kc + 1) / 2, 32);
  std::vector<uint32_t> out(static_cast<size_t>(stride * (side / 32 + 1)));
  for (auto _ : state) {
    AmxPacking{}.a(Operand<Value>{a.data(), side, trans}, 0, side, 0, kc, 32, out.data(), stride);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_value"] =
      benchmark::Counter(static_cast<double>(side * kc), benchmark::Counter::kIsIterationInvariantRate |
                                                             benchmark::Counter::kInvert);
}

template <typename Value>
void pack_b(benchmark::State& state) {
  const int64_t side = state.range(0), kc = side, cols = 256;  // NC, the panel packed at once
  const bool trans = state.range(1) != 0;
  const std::vector<Value> b = operand<Value>(side * side);
  std::vector<uint32_t> out(static_cast<size_t>((kc + 1) / 2 * cols));
  for (auto _ : state) {
    AmxPacking{}.b(Operand<Value>{b.data(), side, trans}, 0, kc, 0, cols, 32, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_value"] =
      benchmark::Counter(static_cast<double>(cols * kc), benchmark::Counter::kIsIterationInvariantRate |
                                                             benchmark::Counter::kInvert);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t side : {256, 1024})
    for (int64_t trans : {1, 0}) b->Args({side, trans});
  b->ArgNames({"side", "trans"})->Unit(benchmark::kMicrosecond);
}

BENCHMARK(pack_a<float>)->Apply(shapes);
BENCHMARK(pack_a<uint16_t>)->Apply(shapes);
BENCHMARK(pack_b<float>)->Apply(shapes);
BENCHMARK(pack_b<uint16_t>)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
