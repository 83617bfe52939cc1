// How fast Loom's GEMM packers lay operands out: GemmPath::kAmx's (src/kernels/gemm/amx.h),
// plain C++ plus SSE, so their cost is measured on any CPU even where no AMX kernel can run;
// and the f32 kernels' packers of bf16 products (packing.h, PlainPacking<AsBf16>: what a bf16
// step packs with on an AVX2 or AVX-512 CPU without AVX512_BF16; 6-row slivers, AVX2's).
// Shapes are a gpt-mini step's: op(A) transposed (the weight gradients' activations, stored
// k x m) and not, op(B) transposed (the forward's weights, stored n x k) and not, from f32
// values and from bf16 bits; in cache (256 x 256) and from memory (1024 x 1024).
//   build/release/bench/gemm_packing_bench [--benchmark_repetitions=5]
// Reports ns per packed value (the `ns_per_value` counter).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm/amx.h"

namespace {

using loom::kernels::gemm_detail::AmxPacking;
using loom::kernels::gemm_detail::AsBf16;
using loom::kernels::gemm_detail::Operand;
using loom::kernels::gemm_detail::PlainPacking;

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

// Packing: AmxPacking (32-row and 32-column slivers of pairs) or PlainPacking<AsBf16> (6-row
// and 16-column slivers of f32 values), with their sizes.
struct Amx {
  using P = AmxPacking;
  static constexpr int kMr = 32, kNr = 32;
};
struct F32Bf16 {
  using P = PlainPacking<AsBf16, float>;
  static constexpr int kMr = 6, kNr = 16;
};

// range(0): the square side (m = k for A, n = k for B); range(1): transposed.
template <typename Packing, typename Value>
void pack_a(benchmark::State& state) {
  using P = typename Packing::P;
  const int64_t side = state.range(0), kc = side;
  const bool trans = state.range(1) != 0;
  const std::vector<Value> a = operand<Value>(side * side);
  const int64_t stride = P::a_stride((kc + P::kStep - 1) / P::kStep, Packing::kMr);
  std::vector<typename P::P> out(static_cast<size_t>(stride * (side / Packing::kMr + 1)));
  for (auto _ : state) {
    P{}.a(Operand<Value>{a.data(), side, trans}, 0, side, 0, kc, Packing::kMr, out.data(), stride);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_value"] =
      benchmark::Counter(static_cast<double>(side * kc), benchmark::Counter::kIsIterationInvariantRate |
                                                             benchmark::Counter::kInvert);
}

template <typename Packing, typename Value>
void pack_b(benchmark::State& state) {
  using P = typename Packing::P;
  const int64_t side = state.range(0), kc = side, cols = 256;  // NC, the panel packed at once
  const bool trans = state.range(1) != 0;
  const std::vector<Value> b = operand<Value>(side * side);
  std::vector<typename P::P> out(static_cast<size_t>((kc + P::kStep - 1) / P::kStep * cols));
  for (auto _ : state) {
    P{}.b(Operand<Value>{b.data(), side, trans}, 0, kc, 0, cols, Packing::kNr, out.data());
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

BENCHMARK(pack_a<Amx, float>)->Apply(shapes);
BENCHMARK(pack_a<Amx, uint16_t>)->Apply(shapes);
BENCHMARK(pack_b<Amx, float>)->Apply(shapes);
BENCHMARK(pack_b<Amx, uint16_t>)->Apply(shapes);
BENCHMARK(pack_a<F32Bf16, float>)->Apply(shapes);
BENCHMARK(pack_a<F32Bf16, uint16_t>)->Apply(shapes);
BENCHMARK(pack_b<F32Bf16, float>)->Apply(shapes);
BENCHMARK(pack_b<F32Bf16, uint16_t>)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
