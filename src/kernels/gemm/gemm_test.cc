// Loom's GEMM against its reference twin, bit for bit: every path this CPU supports (the
// AVX-512, AVX2 and generic micro-kernels), every transpose, strided operands, sizes that
// are 1, primes, not multiples of any tile, and deeper than one packed block; any thread
// count. OpenBLAS is the second oracle, to a tolerance (its order of summation differs).
#include "kernels/gemm/gemm.h"

#include <gtest/gtest.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemm/amx.h"
#include "kernels/gemm/gemm_testing.h"
#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/packing.h"
#include "kernels/gemm/tiles.h"
#include "kernels/precision.h"
#include "kernels/reference/reference.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"

namespace loom::kernels {
namespace {

TEST(Gemm, EveryPathEqualsTheReferenceBitForBit) {
  for (GemmPath path : gemm_supported_paths()) {
    uint64_t seed = 1;
    for (auto [m, n, k] : kShapes)
      for (int t = 0; t < 4; ++t)
        for (bool accumulate : {false, true}) {
          const Problem<float> p(t & 1, t & 2, m, n, k, t == 3 ? 0 : 3, seed += 3);
          EXPECT_TRUE(same_bits(p.run(path, accumulate), p.reference(accumulate)))
              << gemm_path_name(path) << " m=" << m << " n=" << n << " k=" << k
              << " trans_a=" << p.ta << " trans_b=" << p.tb << " accumulate=" << accumulate;
        }
  }
}

TEST(Gemm, DoubleEqualsTheReferenceBitForBit) {
  uint64_t seed = 100;
  for (auto [m, n, k] : kShapes)
    for (int t = 0; t < 4; ++t) {
      const Problem<double> p(t & 1, t & 2, m, n, k, 2, seed += 3);
      EXPECT_TRUE(same_bits(p.run(GemmPath::kAuto, true), p.reference(true)))
          << "m=" << m << " n=" << n << " k=" << k << " t=" << t;
    }
}

// Threads take whole output tiles, so 1, 2, 3 and 4 threads give the same bits; the shapes
// are large enough that the driver does split them.
TEST(Gemm, BitsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  for (GemmPath path : gemm_supported_paths())
    for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {97, 131, 67}, {256, 768, 300}, {5, 1000, 257}, {1000, 7, 300}}) {
      const Problem<float> p(false, true, m, n, k, 1, 7);
      omp_set_num_threads(1);
      const std::vector<float> one = p.run(path, true);
      for (int threads : {2, 3, 4}) {
        omp_set_num_threads(threads);
        EXPECT_TRUE(same_bits(p.run(path, true), one))
            << gemm_path_name(path) << " threads=" << threads << " m=" << m << " n=" << n;
      }
    }
  omp_set_num_threads(saved);
}

// Panels (gemm_panels): every path, op(B) plain and transposed, the few-row tiles, their
// sliver tails, row tiles past 8, n past the last whole sliver; strided A and C; then 1 to
// 3 threads on shapes the driver splits, and the epilogue covering C exactly once.
TEST(Gemm, PanelsEqualTheReferenceBitForBit) {
  uint64_t seed = 500;
  for (GemmPath path : gemm_supported_paths()) {
    set_gemm_path(path);
    for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 33})
      for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
               {1, 1}, {17, 7}, {32, 64}, {33, 5}, {100, 257}, {128, 16}, {160, 9}, {224, 3}, {300, 40}})
        for (int t = 0; t < 2; ++t)
          for (bool accumulate : {false, true}) {
            const Problem<float> p(false, t == 1, m, n, k, 3, seed += 3);
            const PanelMatrix panels = pack_panels(p.tb, k, n, p.b.data(), p.ldb);
            std::vector<float> c = p.c0;
            gemm_panels(m, p.a.data(), p.lda, panels, accumulate, c.data(), p.ldc);
            EXPECT_TRUE(same_bits(c, p.reference(accumulate)))
                << gemm_path_name(path) << " m=" << m << " n=" << n << " k=" << k << " trans_b=" << p.tb
                << " accumulate=" << accumulate;
          }
  }
  set_gemm_path(GemmPath::kAuto);
  const int saved = omp_get_max_threads();
  for (auto shape : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1000, 300}, {8, 770, 256}, {40, 96, 513}}) {
    const int64_t m = std::get<0>(shape), n = std::get<1>(shape), k = std::get<2>(shape);  // (the lambda takes n)
    const Problem<float> p(false, false, m, n, k, 1, 9);
    const PanelMatrix panels = pack_panels(false, k, n, p.b.data(), p.ldb);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> c = p.c0;
      std::vector<int> visits(static_cast<size_t>(m * n), 0);
      gemm_panels(m, p.a.data(), p.lda, panels, true, c.data(), p.ldc,
                  [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* block, int64_t ld) {
                    EXPECT_EQ(block, c.data() + i0 * p.ldc + j0);
                    EXPECT_EQ(ld, p.ldc);
                    for (int64_t i = i0; i < i0 + rows; ++i)
                      for (int64_t j = j0; j < j0 + cols; ++j) ++visits[i * n + j];
                  });
      EXPECT_TRUE(same_bits(c, p.reference(true))) << "threads=" << threads << " m=" << m << " n=" << n;
      EXPECT_EQ(std::count(visits.begin(), visits.end(), 1), m * n) << "threads=" << threads << " m=" << m;
    }
  }
  omp_set_num_threads(saved);
}

TEST(Gemm, EmptyDimensions) {
  std::vector<float> c = {1, 2, 3, 4}, a = {5}, b = {6};
  // k == 0: C is kept when accumulating, zeroed otherwise.
  gemm<float>(false, false, 2, 2, 0, a.data(), 1, b.data(), 2, true, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
  gemm<float>(false, false, 2, 2, 0, a.data(), 1, b.data(), 2, false, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
  // m or n == 0: nothing is touched (null pointers are fine).
  gemm<float>(false, false, 0, 2, 3, nullptr, 3, nullptr, 2, false, nullptr, 2);
  gemm<float>(false, false, 2, 0, 3, nullptr, 3, nullptr, 1, false, nullptr, 1);
}

// The second oracle: OpenBLAS sums in another order, so agreement is to float rounding
// over k terms (2e-5 of the largest |entry| at k <= 600, as the matmul tests).
TEST(Gemm, AgreesWithOpenBlas) {
  for (auto [m, n, k] : kShapes) {
    const Problem<float> p(true, false, m, n, k, 1, 42);
    const std::vector<float> loom = p.run(GemmPath::kAuto, false);
    set_gemm_backend(GemmBackend::kOpenBlas);
    std::vector<float> blas = p.c0;
    gemm<float>(p.ta, p.tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, false, blas.data(),
                p.ldc);
    set_gemm_backend(GemmBackend::kLoom);
    float scale = 0, worst = 0;
    for (size_t i = 0; i < loom.size(); ++i) {
      scale = std::max(scale, std::abs(blas[i]));
      worst = std::max(worst, std::abs(loom[i] - blas[i]));
    }
    EXPECT_LE(worst, 2e-5f * std::max(scale, 1.0f)) << "m=" << m << " n=" << n << " k=" << k;
  }
}

// 16-bit products (gemm_half): every path equals reference::gemm_half bit for bit, bf16 and
// f16, on the shapes above; the AVX512_BF16 path's vdpbf16ps, the f32 SIMD kernels under
// MXCSR's FTZ and DAZ, and the generic kernel's explicit flushes all give one chain.
TEST(GemmHalf, EveryPathEqualsTheReferenceBitForBit) {
  for (GemmPath path : gemm_supported_paths())
    for (DType format : {DType::kBF16, DType::kF16}) {
      uint64_t seed = 1000;
      for (auto [m, n, k] : kShapes)
        for (int t = 0; t < 4; ++t)
          for (bool accumulate : {false, true}) {
            const Problem<float> p(t & 1, t & 2, m, n, k, t == 3 ? 0 : 3, seed += 3);
            EXPECT_TRUE(same_bits(run_half(path, format, p, accumulate), reference_half(format, p, accumulate)))
                << gemm_path_name(path) << " " << dtype_name(format) << " m=" << m << " n=" << n << " k=" << k
                << " trans_a=" << p.ta << " trans_b=" << p.tb << " accumulate=" << accumulate;
          }
    }
}

// A held as 16-bit bits (gemm_half_bits with an f32 B, a weight gradient's kept input), and
// both A and B (mixed precision's MLP gradient): the bits of gemm_half on the f32 values, on
// every path (vdpbf16ps packs the bits into pairs, the others into the values the f32
// kernels multiply), each operand transposed or not, bf16 and f16, with subnormals and, in
// one layout, signalling NaNs among the bits, on the shapes above and wide ones whose row
// pairs cross many 12-row slivers (144 rows: whole 48-column steps of the row-pair packer,
// no rest).
TEST(GemmHalf, OperandsFromBitsEqualOperandsFromTheirValues) {
  auto shapes = kShapes;
  shapes.insert(shapes.end(), {{300, 64, 97}, {1100, 40, 33}, {64, 520, 2050}, {144, 40, 66}});
  for (GemmPath path : paths_and_amx()) {
    set_gemm_path(path);
    for (DType format : {DType::kBF16, DType::kF16}) {
      uint64_t seed = 5000;
      for (auto [m, n, k] : shapes)
        for (int t = 0; t < 4; ++t) {
          const Problem<float> p(t & 1, t & 2, m, n, k, t == 3 ? 0 : 5, seed += 7);
          const StoredOperand a(format, p.a, t == 2, 0), b(format, p.b, t == 1, 3);
          for (bool accumulate : {false, true}) {
            const auto where = [&](const char* which) {
              return cat(which, " ", gemm_path_name(path), " ", dtype_name(format), " m=", p.m, " n=", p.n, " k=", p.k,
                         " trans_a=", p.ta, " trans_b=", p.tb, " accumulate=", accumulate);
            };
            std::vector<float> want = p.c0, got = p.c0;
            gemm_half_on(path, format, p.ta, p.tb, m, n, k, a.values.data(), p.lda, p.b.data(), p.ldb, accumulate,
                         want.data(), p.ldc);
            gemm_half_bits(format, p.ta, p.tb, m, n, k, a.bits.data(), p.lda, p.b.data(), p.ldb, accumulate,
                             got.data(), p.ldc);
            EXPECT_TRUE(same_bits(got, want)) << where("A");
            want = got = p.c0;
            gemm_half_on(path, format, p.ta, p.tb, m, n, k, a.values.data(), p.lda, b.values.data(), p.ldb, accumulate,
                         want.data(), p.ldc);
            gemm_half_bits(format, p.ta, p.tb, m, n, k, a.bits.data(), p.lda, b.bits.data(), p.ldb, accumulate,
                           got.data(), p.ldc);
            EXPECT_TRUE(same_bits(got, want)) << where("A and B");
          }
        }
    }
  }
  set_gemm_path(GemmPath::kAuto);
}

// Values where the flushing shows: operands near 2^-64 (products below f32's smallest
// normal, 2^-126), f32 subnormals, signed zeros, C near 2^-126, and ordinary values that
// cancel; NaN and infinity are left out (their payloads are not part of the contract).
std::vector<float> edge_values(int64_t count, uint64_t seed, bool accumulator) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    const double u = r.uniform(), sign = r.uniform() < 0.5 ? -1.0 : 1.0, mantissa = 1.0 + r.uniform();
    int e = 0;
    if (accumulator) {
      e = u < 0.6 ? -130 + static_cast<int>(r.uniform() * 10) : static_cast<int>(r.uniform() * 6) - 3;
    } else if (u < 0.5) {
      e = -72 + static_cast<int>(r.uniform() * 16);
    } else if (u < 0.7) {
      e = static_cast<int>(r.uniform() * 6) - 3;
    } else if (u < 0.8) {
      e = -140 + static_cast<int>(r.uniform() * 8);  // an f32 subnormal
    } else if (u < 0.9) {
      x = static_cast<float>(sign * 0.0);
      continue;
    } else {
      e = -127 + static_cast<int>(r.uniform() * 6);
    }
    x = static_cast<float>(sign * std::ldexp(mantissa, e));
  }
  return v;
}

// Random f32 (wide) or bf16 bits: exponents anywhere but 255 (no NaN or infinity in),
// often the lowest ones.
uint32_t random_bits(Rng& r, bool wide) {
  const uint32_t e = r.uniform() < 0.3 ? static_cast<uint32_t>(r.uniform() * 4) : static_cast<uint32_t>(r.uniform() * 255);
  const uint32_t mantissa = static_cast<uint32_t>(r.uniform() * (wide ? 8388608.0f : 128.0f));
  const uint32_t sign = r.uniform() < 0.5 ? 1u : 0u;
  return wide ? sign << 31 | e << 23 | mantissa : sign << 15 | e << 7 | mantissa;
}

// A problem (transposes from t's bits) whose operands and C are edge_values.
Problem<float> edge_problem(int t, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Problem<float> p(t & 1, t & 2, m, n, k, 1, seed);
  p.a = edge_values(static_cast<int64_t>(p.a.size()), seed + 1, false);
  p.b = edge_values(static_cast<int64_t>(p.b.size()), seed + 2, false);
  p.c0 = edge_values(static_cast<int64_t>(p.c0.size()), seed + 3, true);
  return p;
}

TEST(GemmHalf, SubnormalsAreFlushedAsVdpbf16psFlushesThem) {
  int64_t flushed = 0;
  uint64_t seed = 77;
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{12, 32, 9}, {13, 40, 64}, {30, 70, 31}})
    for (int t = 0; t < 4; ++t) {
      const Problem<float> p = edge_problem(t, m, n, k, seed += 5);
      const std::vector<float> want = reference_half(DType::kBF16, p, true);
      for (GemmPath path : gemm_supported_paths())
        EXPECT_TRUE(same_bits(run_half(path, DType::kBF16, p, true), want))
            << gemm_path_name(path) << " m=" << m << " n=" << n << " k=" << k << " t=" << t;
      // The inputs do reach the flushing: some results differ from IEEE's chain (counted
      // once per problem, so the bound holds whatever paths this CPU has).
      std::vector<float> ieee = p.c0;
      std::vector<float> ra = p.a, rb = p.b;
      for (float& x : ra) x = bf16_operand(x);
      for (float& x : rb) x = bf16_operand(x);
      reference::gemm(p.ta, p.tb, m, n, k, ra.data(), p.lda, rb.data(), p.ldb, true, ieee.data(), p.ldc);
      for (size_t i = 0; i < want.size(); ++i) flushed += std::memcmp(&want[i], &ieee[i], sizeof(float)) != 0;
    }
  EXPECT_GT(flushed, 20);
}

// The AMX path's packing and arithmetic on any CPU: its slivers (amx.h: A in tile rows of 16
// pairs, B in pairs along k, the first of each pair in the lower half, an odd last k padded)
// through the kernel's plain twin equal reference::gemm_half_amx bit for bit, on the shapes
// above, deeper ones (k past one and two 1024-deep blocks, depths that leave 1-15 pairs
// after the last full tile step), every transpose, from C or from zero, A from f32 values
// and from bf16 bits, and on values where the flushing shows. And how far tdpbf16ps's order
// lands from the chain's (reference::gemm_half) on normal data: within 2k ulps of the sum of
// the products' magnitudes.
TEST(GemmHalf, AmxSliversThroughTheTwinKernelEqualTheAmxReference) {
  const auto amx_reference = [](const Problem<float>& p, bool accumulate) {
    std::vector<float> c = p.c0;
    reference::gemm_half_amx(p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, c.data(),
                             p.ldc);
    return c;
  };
  auto shapes = kShapes;
  shapes.insert(shapes.end(), {{40, 70, 1101}, {33, 65, 2050}, {64, 32, 1057}, {31, 97, 30}});
  uint64_t seed = 9000;
  double worst = 0;          // |twin - chain| / (|C| + sum |x y|), over every element
  int64_t differ = 0, elements = 0;
  for (auto [m, n, k] : shapes)
    for (int t = 0; t < 4; ++t)
      for (bool accumulate : {false, true}) {
        const Problem<float> p(t & 1, t & 2, m, n, k, t == 3 ? 0 : 3, seed += 3);
        const auto where = [&] {
          return cat("m=", p.m, " n=", p.n, " k=", p.k, " trans_a=", p.ta, " trans_b=", p.tb, " accumulate=", accumulate);
        };
        std::vector<float> got = p.c0;
        gemm_detail::gemm_half_amx_twin(p.ta, p.tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate,
                                        got.data(), p.ldc);
        EXPECT_TRUE(same_bits(got, amx_reference(p, accumulate))) << where();
        const StoredOperand a(DType::kBF16, p.a, t == 2, 0);
        std::vector<float> from_values = p.c0, from_bits = p.c0;
        gemm_detail::gemm_half_amx_twin(p.ta, p.tb, m, n, k, a.values.data(), p.lda, p.b.data(), p.ldb, accumulate,
                                        from_values.data(), p.ldc);
        gemm_detail::gemm_half_amx_twin(p.ta, p.tb, m, n, k, a.bits.data(), p.lda, p.b.data(), p.ldb, accumulate,
                                        from_bits.data(), p.ldc);
        EXPECT_TRUE(same_bits(from_bits, from_values)) << "A from bits, " << where();
        const std::vector<float> chain = reference_half(DType::kBF16, p, accumulate);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double scale = accumulate ? std::fabs(p.c0[i * p.ldc + j]) : 0.0;
            for (int64_t q = 0; q < k; ++q)
              scale += std::fabs(bf16_operand(p.ta ? p.a[q * p.lda + i] : p.a[i * p.lda + q]) *
                                 bf16_operand(p.tb ? p.b[j * p.ldb + q] : p.b[q * p.ldb + j]));
            const double diff = std::fabs(double(got[i * p.ldc + j]) - double(chain[i * p.ldc + j]));
            if (scale > 0) worst = std::max(worst, diff / scale / (2.0 * k * 0x1p-24));
            ++elements;
            differ += diff != 0;
            EXPECT_LE(diff, 2.0 * k * 0x1p-24 * scale) << "against the chain, " << where() << " at " << i << ", " << j;
          }
      }
  std::printf("AMX order against the chain: %lld of %lld elements differ, the largest by %.3f of 2k ulps of the "
              "magnitudes' sum\n", static_cast<long long>(differ), static_cast<long long>(elements), worst);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 32, 9}, {33, 40, 64}, {30, 70, 31}})
    for (int t = 0; t < 4; ++t) {
      const Problem<float> p = edge_problem(t, m, n, k, seed += 5);
      std::vector<float> got = p.c0;
      gemm_detail::gemm_half_amx_twin(p.ta, p.tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, true, got.data(),
                                      p.ldc);
      EXPECT_TRUE(same_bits(got, amx_reference(p, true))) << "edge values m=" << m << " k=" << k;
    }
  // f32 NaNs whose payload lies only in the bits rounding drops (a conversion that rounded
  // them would make infinities), quiet ones, and infinities, in both operands; a NaN out
  // only has to be a NaN.
  const uint32_t specials[] = {0x7f800001u, 0xff80ffffu, 0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u};
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 32, 33}, {40, 48, 70}})
    for (int t = 0; t < 4; ++t) {
      Problem<float> p = edge_problem(t, m, n, k, seed += 5);
      for (size_t i = 0; i < 6; ++i) {
        p.a[(i * 997 + t) % p.a.size()] = std::bit_cast<float>(specials[i]);
        p.b[(i * 613 + 5 * t) % p.b.size()] = std::bit_cast<float>(specials[5 - i]);
      }
      std::vector<float> got = p.c0;
      gemm_detail::gemm_half_amx_twin(p.ta, p.tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, true, got.data(),
                                      p.ldc);
      EXPECT_TRUE(same_bits_or_nan(got, amx_reference(p, true))) << "NaN and infinity m=" << m << " k=" << k << " t=" << t;
    }
}

// Where the CPU has AMX: tdpbf16ps through the kernel computes as its twin (amx.h) on random
// bit patterns of every exponent, C and both operands, depths of 1 to 40 pairs (full tile
// steps and padded rests), a NaN only as a NaN; and the path's products equal
// reference::gemm_half_amx bit for bit (the shapes above, every transpose, from C or zero).
// Where the first fails, the instruction rounds, flushes or orders its sums otherwise than
// the SDM says, and docs/numerics.md must say how.
TEST(GemmHalf, AmxTilesComputeAsTheTwinAndTheReference) {
  if (!gemm_path_supported(GemmPath::kAmx)) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16";
  Rng r(11);
  const auto bits = [&](bool wide) { return random_bits(r, wide); };
  int64_t mismatches = 0, lanes = 0;
  for (int round = 0; round < 400; ++round) {
    const int64_t depth = 1 + round % 40;
    std::vector<uint32_t> a(static_cast<size_t>(32 * depth)), b(static_cast<size_t>(32 * depth));
    for (auto& x : a) x = bits(false) << 16 | bits(false);
    for (auto& x : b) x = bits(false) << 16 | bits(false);
    std::vector<float> c(32 * 32);
    for (auto& x : c) x = std::bit_cast<float>(bits(true));
    std::vector<float> got = c, want = c;
    gemm_detail::kAmxKernel.fn(depth, a.data(), b.data(), got.data(), 32, round % 2 == 0 ? got.data() : nullptr, 32);
    gemm_detail::microkernel_amx_twin(depth, a.data(), b.data(), want.data(), 32,
                                      round % 2 == 0 ? want.data() : nullptr, 32);
    for (size_t i = 0; i < got.size(); ++i) {
      ++lanes;
      mismatches += !(std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&want[i], &got[i], sizeof(float)) == 0);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << lanes << " lanes";
  uint64_t seed = 9500;
  for (auto [m, n, k] : kShapes)
    for (int t = 0; t < 4; ++t)
      for (bool accumulate : {false, true}) {
        const Problem<float> p(t & 1, t & 2, m, n, k, 3, seed += 3);
        std::vector<float> want = p.c0;
        reference::gemm_half_amx(p.ta, p.tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, want.data(),
                                 p.ldc);
        EXPECT_TRUE(same_bits(run_half(GemmPath::kAmx, DType::kBF16, p, accumulate), want))
            << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << p.ta << " trans_b=" << p.tb;
      }
}

// The contract's basis: vdpbf16ps is, per lane, two fused multiply-adds in turn (the upper
// pair first), with subnormal inputs read and results written as zero. The AVX512_BF16
// micro-kernel on random bit patterns of every exponent against that emulation; a NaN
// (an infinity's product with zero, or infinities of both signs) only has to be a NaN.
TEST(GemmHalf, Vdpbf16psIsTwoFlushedFmas) {
  if (!gemm_path_supported(GemmPath::kAvx512Bf16)) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const auto& mk = gemm_detail::kAvx512Bf16Kernel;
  Rng r(5);
  const auto bits = [&](bool wide) { return random_bits(r, wide); };
  const auto value = [](uint32_t half) { return flush_subnormal(std::bit_cast<float>(half << 16)); };
  std::vector<uint32_t> a(12 * 3);  // broadcast, so unaligned is fine; B is loaded aligned
  std::vector<float> c(12 * 32), got(12 * 32);
  int64_t mismatches = 0, lanes = 0;
  for (int round = 0; round < 3000; ++round) {
    const int depth = 1 + round % 3;
    for (auto& x : a) x = bits(false) << 16 | bits(false);
    for (auto& x : c) x = std::bit_cast<float>(bits(true));
    alignas(64) uint32_t pb[32 * 3];
    for (int i = 0; i < 32 * depth; ++i) pb[i] = bits(false) << 16 | bits(false);
    got = c;
    mk.fn(depth, a.data(), pb, got.data(), 32, got.data(), 32);
    for (int row = 0; row < 12; ++row)
      for (int j = 0; j < 32; ++j) {
        float acc = flush_subnormal(c[row * 32 + j]);
        for (int q = 0; q < depth; ++q) {
          const uint32_t x = a[q * 12 + row], y = pb[q * 32 + j];
          acc = flush_subnormal(std::fma(value(x >> 16), value(y >> 16), acc));
          acc = flush_subnormal(std::fma(value(x & 0xffffu), value(y & 0xffffu), acc));
        }
        const float hw = got[row * 32 + j];
        ++lanes;
        mismatches += !(std::isnan(acc) ? std::isnan(hw) : std::memcmp(&acc, &hw, sizeof(float)) == 0);
      }
  }
  EXPECT_EQ(mismatches, 0) << "of " << lanes << " lanes";
}

// The bits packers move bf16 bits into pairs as they are (microkernel_bf16.cc), where the f32
// packers' conversion reads a subnormal as zero and quiets a NaN: vdpbf16ps must give every
// accumulator the same bits from raw words as from those words fixed first. Every one of the
// 65,536 words, in either half of a pair, in A and in B, beside zeros, subnormals,
// infinities, NaNs and normals, onto accumulators of every kind.
TEST(GemmHalf, Vdpbf16psReadsRawBitsAsFixedOnes) {
  if (!gemm_path_supported(GemmPath::kAvx512Bf16)) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const auto& mk = gemm_detail::kAvx512Bf16Kernel;
  const uint16_t others[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080, 0x3f80, 0xbf80,
                             0x7f80, 0xff80, 0x7f81, 0xff81, 0x7fc0, 0xffc0, 0x7fbf, 0xffff, 0x4000, 0xc2f7,
                             0x1234, 0x0040, 0x7f7f, 0xff7f, 0x00ff, 0x3c01, 0x8d10};
  const uint32_t accs[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u, 0xff800000u,
                           0x7fc00000u, 0x7f800001u, 0xffc00123u, 0x00000001u, 0x80400000u, 0x00800000u,
                           0x7f7fffffu, 0x4b000000u, 0x33d6bf95u, 0x9e3779b9u, 0x0d000000u};
  constexpr int kOthers = sizeof(others) / sizeof(others[0]), kAccs = sizeof(accs) / sizeof(accs[0]);
  const auto fixed = [](uint32_t pair) {
    return uint32_t{bf16_operand_bits_of_bits(static_cast<uint16_t>(pair >> 16))} << 16 |
           bf16_operand_bits_of_bits(static_cast<uint16_t>(pair & 0xffffu));
  };
  // A pair holding word x in the upper half (lane parity 0) or the lower, the other half o.
  const auto with = [](uint32_t x, uint16_t o, int lane) { return lane % 2 == 0 ? x << 16 | o : uint32_t{o} << 16 | x; };
  alignas(64) uint32_t a[12], b[32], a_fixed[12], b_fixed[32];
  std::vector<float> from(12 * 32), raw(12 * 32), fix(12 * 32);
  int64_t lanes = 0, differ = 0;
  for (uint32_t x = 0; x < 65536; ++x)
    for (const bool in_a : {true, false}) {
      for (int r = 0; r < 12; ++r)
        a[r] = in_a ? with(x, others[(x + r) % kOthers], r)
                    : uint32_t{others[(x + r) % kOthers]} << 16 | others[(x + 5 * r + 1) % kOthers];
      for (int j = 0; j < 32; ++j)
        b[j] = !in_a ? with(x, others[(x + j) % kOthers], j)
                     : uint32_t{others[(x + 3 * j) % kOthers]} << 16 | others[(x + j + 7) % kOthers];
      for (int i = 0; i < 12 * 32; ++i) from[i] = std::bit_cast<float>(accs[(x + i) % kAccs]);
      for (int r = 0; r < 12; ++r) a_fixed[r] = fixed(a[r]);
      for (int j = 0; j < 32; ++j) b_fixed[j] = fixed(b[j]);
      mk.fn(1, a, b, raw.data(), 32, from.data(), 32);
      mk.fn(1, a_fixed, b_fixed, fix.data(), 32, from.data(), 32);
      lanes += 12 * 32;
      for (int i = 0; i < 12 * 32; ++i)
        differ += std::bit_cast<uint32_t>(raw[i]) != std::bit_cast<uint32_t>(fix[i]);
    }
  EXPECT_EQ(differ, 0) << "of " << lanes << " lanes";
}

TEST(GemmHalf, BitsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  for (GemmPath path : paths_and_amx())
    for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{256, 768, 301}, {1000, 7, 300}}) {
      const Problem<float> p(true, false, m, n, k, 1, 8);
      omp_set_num_threads(1);
      const std::vector<float> one = run_half(path, DType::kBF16, p, true);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        EXPECT_TRUE(same_bits(run_half(path, DType::kBF16, p, true), one))
            << gemm_path_name(path) << " threads=" << threads << " m=" << m << " n=" << n;
      }
    }
  omp_set_num_threads(saved);
}

// p's product into c, bf16 (half) or f32, with the hooks.
void hooked_product(const Problem<float>& p, bool half, bool accumulate, std::vector<float>& c,
                    const GemmEpilogue<float>& epilogue, const GemmPrologue<float>& prologue) {
  if (half)
    gemm_half(DType::kBF16, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, c.data(),
              p.ldc, epilogue, prologue);
  else
    gemm<float>(p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, c.data(), p.ldc, epilogue,
                prologue);
}

// Every product of each shape (each transpose) on `thread_counts` threads against one
// thread, bit for bit: every path, f32 and bf16 products, operands as values and as bits,
// AMX's twin kernel, a prologue and an epilogue.
void expect_thread_counts_give_one_threads_bits(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& shapes,
                                                const std::vector<int>& thread_counts, uint64_t seed) {
  const int saved = omp_get_max_threads();
  const auto each_threads = [&](const std::string& what, const auto& run) {
    omp_set_num_threads(1);
    const std::vector<float> one = run();
    for (int threads : thread_counts) {
      omp_set_num_threads(threads);
      EXPECT_TRUE(same_bits_or_nan(run(), one)) << what << " threads=" << threads;
    }
  };
  for (auto [m, n, k] : shapes)
    for (int t = 0; t < 4; ++t) {
      const Problem<float> p(t & 1, t & 2, m, n, k, 1, seed += 3);
      const std::string shape = " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " trans_a=" + std::to_string(p.ta) + " trans_b=" + std::to_string(p.tb);
      for (GemmPath path : paths_and_amx()) {
        if (path != GemmPath::kAmx) each_threads(gemm_path_name(path) + shape, [&] { return p.run(path, true); });
        each_threads(std::string("bf16 ") + gemm_path_name(path) + shape,
                     [&] { return run_half(path, DType::kBF16, p, true); });
      }
      const StoredOperand a(DType::kBF16, p.a, false, 1), b(DType::kBF16, p.b, true, 2);
      each_threads("bits" + shape, [&] {
        std::vector<float> c = p.c0;
        gemm_half_bits(DType::kBF16, p.ta, p.tb, p.m, p.n, p.k, a.bits.data(), p.lda, b.bits.data(), p.ldb, true,
                       c.data(), p.ldc);
        return c;
      });
      each_threads("amx twin" + shape, [&] {
        std::vector<float> c = p.c0;
        gemm_detail::gemm_half_amx_twin(p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, true,
                                        c.data(), p.ldc);
        return c;
      });
      const std::vector<float> bias = random_matrix<float>(n, seed + 5);
      each_threads("prologue" + shape, [&] {
        std::vector<float> c = p.c0;
        hooked_product(p, true, false, c, {}, GemmPrologue<float>(bias.data()));
        return c;
      });
      const GemmEpilogue<float> halve_add_row([&](int64_t, int64_t rows, int64_t j0, int64_t cols, float* block,
                                                  int64_t ld) {
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) block[i * ld + j] = block[i * ld + j] * 0.5f + bias[j0 + j];
      });
      each_threads("epilogue" + shape, [&] {
        std::vector<float> c = p.c0;
        hooked_product(p, false, false, c, halve_add_row, {});
        return c;
      });
    }
  omp_set_num_threads(saved);
}

// Where threads take bands of rows (or of columns), op(B) (or op(A)) packed once for all of
// them (set_gemm_shared_pack) gives the bits of one thread: each transpose, odd k and k past
// one packed block (the tiles then read the shared operand at later depths), 2 to 4 threads.
TEST(Gemm, AnOperandPackedOnceForEveryBandGivesTheSameBits) {
  set_gemm_shared_pack(GemmSharedPack::kOn);
  expect_thread_counts_give_one_threads_bits({{1100, 96, 257}, {600, 131, 1030}, {300, 40, 2100},  // bands of rows
                                              {96, 1100, 257}, {131, 600, 1030}, {40, 300, 2100}},  // of columns
                                             {2, 3, 4}, 4000);
  set_gemm_shared_pack(GemmSharedPack::kAuto);
}

// Where whole-sliver bands leave some threads more than others, both operands are packed
// once and each thread takes one tile of a grid (gemm_detail::plan_tiles): the bits of one
// thread, each transpose, odd k and k past a packed block, on 6, 8 and 16 threads (more
// threads than this machine's cores change no bit). The shapes are ones where the plan takes
// the grid for the AVX2 and AVX-512 kernels on some of those thread counts.
TEST(Gemm, AGridOfTilesOnOperandsPackedOnceGivesTheSameBits) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {100, 400, 257}, {300, 90, 1030}, {150, 600, 530}, {40, 700, 97}, {257, 129, 600}};
  const std::vector<int> thread_counts = {6, 8, 16};
  int grids_avx2 = 0, grids_avx512 = 0, grids_bf16 = 0;
  for (auto [m, n, k] : shapes)
    for (int threads : thread_counts)
      for (bool wide : {false, true}) {
        grids_avx2 += gemm_detail::plan_tiles(gemm_detail::kAvx2Kernel, m, n, k, wide, false, threads).grid_m != 0;
        grids_avx512 += gemm_detail::plan_tiles(gemm_detail::kAvx512Kernel, m, n, k, wide, false, threads).grid_m != 0;
        grids_bf16 += gemm_detail::plan_tiles(gemm_detail::kAvx512Bf16Kernel, m, n, k, wide, false, threads).grid_m != 0;
      }
  EXPECT_GE(grids_avx2, 8);
  EXPECT_GE(grids_avx512, 8);
  EXPECT_GE(grids_bf16, 8);
  expect_thread_counts_give_one_threads_bits(shapes, thread_counts, 7000);
}

// The largest share of a product's MR x NR blocks any thread computes, against an even
// split, for every product of gpt-mini's and gpt2-124m's steps on 8 and 16 threads with
// the AVX-512 f32 and bf16 kernels and the AVX2 one: within 3.5% (whole-sliver bands alone
// left up to a third more on one thread: gpt-mini's qkv weight gradient, 12 column bands of
// 64 for 16 threads). All but gpt2-124m's head input gradient (k = 50,257: its operands
// would pack into 360 MiB, past the grid's 64, so it keeps 15 bands, 12% over), which the
// plan must leave as bands.
TEST(Gemm, EveryThreadGetsAnEvenShareOfTheModelsProducts) {
  struct Product {
    const char* name;
    int64_t m, n, k;
    bool wide;  // op(B) transposed
  };
  const std::vector<Product> products = {
      {"gpt-mini qkv fwd", 2048, 768, 256, false},    {"gpt-mini qkv dinp", 2048, 256, 768, true},
      {"gpt-mini qkv dw", 256, 768, 2048, false},     {"gpt-mini attn.proj dw", 256, 256, 2048, false},
      {"gpt-mini fc fwd", 2048, 1024, 256, false},    {"gpt-mini fc dinp", 2048, 256, 1024, true},
      {"gpt-mini fc dw", 256, 1024, 2048, false},     {"gpt-mini fc.proj fwd", 2048, 256, 1024, false},
      {"gpt-mini fc.proj dinp", 2048, 1024, 256, true}, {"gpt-mini fc.proj dw", 1024, 256, 2048, false},
      {"gpt-mini head fwd", 2048, 256, 256, true},    {"gpt2 qkv fwd", 1024, 2304, 768, false},
      {"gpt2 qkv dinp", 1024, 768, 2304, true},       {"gpt2 qkv dw", 768, 2304, 1024, false},
      {"gpt2 attn.proj fwd", 1024, 768, 768, false},  {"gpt2 attn.proj dw", 768, 768, 1024, false},
      {"gpt2 fc fwd", 1024, 3072, 768, false},        {"gpt2 fc dinp", 1024, 768, 3072, true},
      {"gpt2 fc dw", 768, 3072, 1024, false},         {"gpt2 fc.proj fwd", 1024, 768, 3072, false},
      {"gpt2 fc.proj dinp", 1024, 3072, 768, true},   {"gpt2 fc.proj dw", 3072, 768, 1024, false},
      {"gpt2 head fwd", 1024, 50257, 768, true},      {"gpt2 head dw", 50257, 768, 1024, false}};
  const auto check = [&](const char* kernel, const auto& mk) {
    for (int threads : {8, 16}) {
      for (const Product& p : products) {
        const gemm_detail::TilePlan plan = gemm_detail::plan_tiles(mk, p.m, p.n, p.k, p.wide, false, threads);
        const double even = static_cast<double>(gemm_detail::round_up(p.m, mk.mr) * gemm_detail::round_up(p.n, mk.nr)) / threads;
        EXPECT_LE(plan.load, 1.035 * even) << kernel << " " << p.name << ", " << threads << " threads: " << plan.load / even;
      }
      EXPECT_EQ(gemm_detail::plan_tiles(mk, 1024, 768, 50257, false, false, threads).grid_m, 0) << kernel << " head dinp";
    }
  };
  check("avx512", gemm_detail::kAvx512Kernel);
  check("avx512_bf16", gemm_detail::kAvx512Bf16Kernel);
  check("avx2", gemm_detail::kAvx2Kernel);
}

// f(p, row) for each of kShapes and `extra`: a strided problem, op(B) transposed for every
// other seed, and a row of n random values.
template <typename F>
void for_each_problem(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& extra, uint64_t seed, F&& f) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = kShapes;
  shapes.insert(shapes.end(), extra.begin(), extra.end());
  for (const auto& [m, n, k] : shapes) {
    seed += 3;
    f(Problem<float>(false, (seed & 2) != 0, m, n, k, 2, seed), random_matrix<float>(n, seed + 7));
  }
}

// A prologue's row, which every row's chains start from (the kernels load it with a row
// stride of 0), gives the bits of C filled with the row beforehand and accumulated onto: every
// path, f32 and bf16, the blocks at the tiles' edges (copied), the few-row path, k == 0 and
// past one packed block, 1 and 3 threads, and OpenBLAS.
TEST(Gemm, PrologueEqualsAPrefilledC) {
  const int saved = omp_get_max_threads();
  const auto check = [&](const char* what, bool half) {
    for_each_problem({{5, 7, 0}, {256, 768, 300}, {1000, 70, 300}, {40, 300, 2100}}, 500, [&](const Problem<float>& p,
                                                                            const std::vector<float>& bias) {
      const int64_t m = p.m, n = p.n, k = p.k;
      std::vector<float> filled = p.c0, hooked = p.c0;
      for (int64_t i = 0; i < m; ++i) std::copy(bias.begin(), bias.end(), filled.begin() + i * p.ldc);
      hooked_product(p, half, true, filled, {}, {});
      hooked_product(p, half, false, hooked, {}, GemmPrologue<float>(bias.data()));
      EXPECT_TRUE(same_bits(hooked, filled)) << what << " bf16=" << half << " m=" << m << " n=" << n << " k=" << k;
    });
  };
  for (GemmPath path : paths_and_amx())
    for (int threads : {1, 3}) {
      set_gemm_path(path);
      omp_set_num_threads(threads);
      for (bool half : {false, true}) check(gemm_path_name(path), half);
    }
  set_gemm_path(GemmPath::kAuto);
  set_gemm_backend(GemmBackend::kOpenBlas);
  for (bool half : {false, true}) check("openblas", half);
  set_gemm_backend(GemmBackend::kLoom);
  omp_set_num_threads(saved);
}

// A scratch epilogue is handed every element once, with the bits of the product into C (with
// and without a prologue): every path, f32 and bf16, few rows, k past one packed block, 1
// and 3 threads, and OpenBLAS. Where a packed product passes over k once, C is not written.
TEST(Gemm, AScratchEpilogueSeesTheProductsBits) {
  const int saved = omp_get_max_threads();
  const auto check = [&](const std::string& what, bool half, bool bias, bool loom) {
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> extra = {
        {64, 96, 60}, {300, 200, 64}, {256, 768, 300}, {40, 300, 2100}};
    for_each_problem(extra, 900, [&](const Problem<float>& p, const std::vector<float>& row) {
      const int64_t m = p.m, n = p.n, k = p.k;
      const GemmPrologue<float> prologue = bias ? GemmPrologue<float>(row.data()) : GemmPrologue<float>();
      std::vector<float> plain = p.c0, scratch = p.c0, seen(static_cast<size_t>(m * n), 0.0f);
      std::vector<std::atomic<int>> visits(static_cast<size_t>(m * n));
      const GemmEpilogue<float> take(
          [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* block, int64_t ld) {
            for (int64_t i = i0; i < i0 + rows; ++i)
              for (int64_t j = j0; j < j0 + cols; ++j) {
                seen[i * n + j] = block[(i - i0) * ld + j - j0];
                ++visits[i * n + j];
              }
          },
          /*scratch=*/true);
      hooked_product(p, half, false, plain, {}, prologue);
      hooked_product(p, half, false, scratch, take, prologue);
      std::vector<float> product(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m; ++i)
        std::copy(plain.begin() + i * p.ldc, plain.begin() + i * p.ldc + n, product.begin() + i * n);
      const std::string where = cat(what, " bf16=", half, " bias=", bias, " m=", m, " n=", n, " k=", k);
      EXPECT_TRUE(same_bits(seen, product)) << where;
      EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](const std::atomic<int>& v) { return v == 1; })) << where;
      if (loom && m >= 64 && k <= 64) {
        EXPECT_TRUE(same_bits(scratch, p.c0)) << where << ": C was written";
      }
    });
  };
  for (GemmPath path : paths_and_amx())
    for (int threads : {1, 3}) {
      set_gemm_path(path);
      omp_set_num_threads(threads);
      for (bool half : {false, true})
        for (bool bias : {false, true}) check(cat(gemm_path_name(path), " threads=", threads), half, bias, true);
    }
  set_gemm_path(GemmPath::kAuto);
  set_gemm_backend(GemmBackend::kOpenBlas);
  for (bool half : {false, true}) check("openblas", half, true, false);
  set_gemm_backend(GemmBackend::kLoom);
  omp_set_num_threads(saved);
}

// The process-wide entry point and the OpenBLAS backend (sgemm on the rounded values,
// another order: a tolerance), and MXCSR's control bits (FTZ, DAZ, rounding, masks) left as
// they were on the calling thread. Not its sticky exception flags: any arithmetic sets them,
// and LLVM's OpenMP runtime (the Clang build) sets and clears them on the calling thread
// around a parallel region, whatever the product does.
TEST(GemmHalf, TheBackendsAgreeAndMxcsrIsRestored) {
  const Problem<float> p(false, true, 64, 96, 200, 2, 31);
  const auto control = [] { return _mm_getcsr() & ~0x3fu; };
  const unsigned before = control();
  std::vector<float> loom = p.c0, blas = p.c0;
  gemm_half(DType::kBF16, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, false, loom.data(), p.ldc);
  EXPECT_EQ(control(), before);
  EXPECT_TRUE(same_bits(loom, reference_half(DType::kBF16, p, false)));
  set_gemm_backend(GemmBackend::kOpenBlas);
  gemm_half(DType::kBF16, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, false, blas.data(), p.ldc);
  set_gemm_backend(GemmBackend::kLoom);
  for (size_t i = 0; i < loom.size(); ++i) EXPECT_NEAR(loom[i], blas[i], 1e-4f * std::max(1.0f, std::abs(loom[i])));
}

// The plain packers at every kernel's MR and NR (AVX-512's 12 x 32 among them, which a CPU
// without AVX-512 never runs), for f32 and f64 values, f32 values and bf16 or f16 bits read
// as 16-bit operands: each sliver holds what microkernel.h's layout says, zero-padded, for
// both transposes, partial slivers and depths that are not a multiple of the transposes' 4
// (130: f16 bits' packers make values 64 or 32 at a time first, several times then).
template <typename Cvt, typename T, typename V>
void expect_plain_packing(int mr, int nr, int64_t rows, int64_t cols, int64_t kc, bool ta, bool tb, uint64_t seed) {
  const int64_t lda = (ta ? rows : kc) + 3, ldb = (tb ? kc : cols) + 3;  // strided
  const auto stored = [&](int64_t count, uint64_t s) {
    const std::vector<float> values = random_matrix<float>(count, s);
    std::vector<V> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_same_v<V, uint16_t>) {
        out[i] = std::is_same_v<Cvt, gemm_detail::AsF16> ? f16_bits(values[i]) : bf16_bits(values[i]);
      } else {
        out[i] = static_cast<V>(values[i]);
      }
    }
    return out;
  };
  const std::vector<V> a = stored((ta ? kc : rows) * lda, seed), b = stored((tb ? cols : kc) * ldb, seed + 1);
  const auto value = [](V x) -> T {
    if constexpr (std::is_same_v<Cvt, gemm_detail::AsIs>) {
      return x;
    } else {
      return Cvt::value(x);
    }
  };
  const auto bits = [](T x) {
    if constexpr (sizeof(T) == 4) {
      return uint64_t{std::bit_cast<uint32_t>(x)};
    } else {
      return std::bit_cast<uint64_t>(x);
    }
  };
  const gemm_detail::PlainPacking<Cvt, T> packing;
  const int64_t stride = packing.a_stride(kc, mr), slivers = (rows + mr - 1) / mr, b_slivers = (cols + nr - 1) / nr;
  std::vector<T> pa(stride * slivers, T(7)), pb(b_slivers * kc * nr, T(7));
  packing.a(gemm_detail::Operand<V>{a.data(), lda, ta}, 0, rows, 0, kc, mr, pa.data(), stride);
  packing.b(gemm_detail::Operand<V>{b.data(), ldb, tb}, 0, kc, 0, cols, nr, pb.data());
  const std::string where = cat("mr=", mr, " nr=", nr, " rows=", rows, " cols=", cols, " kc=", kc, " ta=", ta,
                                " tb=", tb, " value bytes=", sizeof(V), " slot bytes=", sizeof(T));
  for (int64_t i = 0; i < slivers * mr; ++i)
    for (int64_t q = 0; q < kc; ++q) {
      const T want = i < rows ? value(ta ? a[q * lda + i] : a[i * lda + q]) : T(0);
      ASSERT_EQ(bits(pa[(i / mr) * stride + q * mr + i % mr]), bits(want)) << "A row " << i << " k " << q << " " << where;
    }
  for (int64_t j = 0; j < b_slivers * nr; ++j)
    for (int64_t q = 0; q < kc; ++q) {
      const T want = j < cols ? value(tb ? b[j * ldb + q] : b[q * ldb + j]) : T(0);
      ASSERT_EQ(bits(pb[(j / nr) * kc * nr + q * nr + j % nr]), bits(want)) << "B column " << j << " k " << q << " " << where;
    }
}

TEST(Gemm, PlainPackersWriteTheLayoutAtEveryKernelShape) {
  uint64_t seed = 900;
  for (auto [mr, nr] : {std::pair{12, 32}, {6, 16}, {4, 16}, {4, 8}})
    for (auto [rows, cols, kc] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 7, 3}, {12, 32, 4},
                                   {13, 45, 9}, {37, 70, 33}, {14, 40, 130}})
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        expect_plain_packing<gemm_detail::AsIs, float, float>(mr, nr, rows, cols, kc, ta, tb, seed += 2);
        expect_plain_packing<gemm_detail::AsIs, double, double>(mr, nr, rows, cols, kc, ta, tb, seed += 2);
        expect_plain_packing<gemm_detail::AsBf16, float, float>(mr, nr, rows, cols, kc, ta, tb, seed += 2);
        expect_plain_packing<gemm_detail::AsBf16, float, uint16_t>(mr, nr, rows, cols, kc, ta, tb, seed += 2);
        expect_plain_packing<gemm_detail::AsF16, float, uint16_t>(mr, nr, rows, cols, kc, ta, tb, seed += 2);
      }
}

TEST(Gemm, UnsupportedPathIsRefusedByName) {
  for (GemmPath path : {GemmPath::kAmx, GemmPath::kAvx512Bf16, GemmPath::kAvx512, GemmPath::kAvx2}) {
    if (gemm_path_supported(path)) continue;
    try {
      set_gemm_path(path);
      FAIL() << "expected an error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(gemm_path_name(path)), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(set_gemm_path(GemmPath::kGeneric));
  set_gemm_path(GemmPath::kAuto);
}

}  // namespace
}  // namespace loom::kernels
