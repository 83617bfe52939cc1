// The int8 product against its reference twin, bit for bit: every path this CPU runs
// (AVX-512 VNNI, AVX2, generic), both weight layouts, sizes that are 1, primes and not
// multiples of the kernels' tiles (64 channels; rows dealt out in passes of 1 to 6) or the
// padding, any thread count; and against the f32 product to the tolerance int8 promises.
#include "kernels/int8_matmul.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/pointwise.h"
#include "kernels/reference/reference.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"

namespace loom::kernels {
namespace {

std::vector<float> normal(int64_t count, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = scale * static_cast<float>(r.normal());
  return v;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// (n, k, m)
const std::vector<std::tuple<int64_t, int64_t, int64_t>> kShapes = {
    {1, 1, 1},   {1, 64, 4},  {3, 65, 5},  {4, 256, 768}, {5, 127, 13},   {17, 300, 37},
    {16, 1024, 256}, {6, 33, 48}, {8, 96, 80}, {2, 8, 33},     {12, 260, 130}, {7, 40, 70}, {13, 64, 64}};

struct RestorePath {
  ~RestorePath() { set_int8_path(Int8Path::kAuto); }
};

TEST(Int8Matmul, EveryPathEqualsTheReferenceBitForBit) {
  RestorePath restore;
  for (auto [n, k, m] : kShapes)
    for (WeightLayout layout : {WeightLayout::kKM, WeightLayout::kMK}) {
      const auto x = normal(n * k, 1 + n), w = normal(k * m, 2 + m, 0.05f), b = normal(m, 3);
      const Int8Weight q = quantize_int8(w.data(), k, m, layout);
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {  // no bias: fma(., ., +0)
        std::vector<float> want(static_cast<size_t>(n * m));
        reference::int8_matmul_forward(want.data(), x.data(), w.data(), bias, n, k, m, layout);
        for (Int8Path path : int8_supported_paths()) {
          set_int8_path(path);
          std::vector<float> got(want.size(), -1.0f);
          int8_matmul_forward(got.data(), x.data(), q, bias, n);
          EXPECT_TRUE(same_bits(got, want))
              << int8_path_name(path) << " n=" << n << " k=" << k << " m=" << m << (bias ? "" : " without bias");
        }
      }
    }
}

TEST(Int8Matmul, BitsDoNotDependOnThreadCount) {
  const int64_t n = 40, k = 700, m = 301;  // enough work for the pool (int8_matmul.cc)
  const auto x = normal(n * k, 4), w = normal(k * m, 5, 0.05f);
  const Int8Weight q = quantize_int8(w.data(), k, m, WeightLayout::kKM);
  std::vector<float> one(static_cast<size_t>(n * m)), two(one.size());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  int8_matmul_forward(one.data(), x.data(), q, nullptr, n);
  omp_set_num_threads(2);
  int8_matmul_forward(two.data(), x.data(), q, nullptr, n);
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bits(one, two));
}

// Quantizing both operands to 8 bits costs about 1% of a product's size on normal data.
TEST(Int8Matmul, StaysCloseToTheFloatProductAndFusesGelu) {
  const int64_t n = 8, k = 512, m = 96;
  const auto x = normal(n * k, 6), w = normal(k * m, 7, 0.05f), b = normal(m, 8);
  std::vector<float> exact(static_cast<size_t>(n * m)), got(exact.size()), gelu(exact.size());
  reference::matmul_forward(exact.data(), x.data(), w.data(), b.data(), n, k, m, WeightLayout::kKM);
  int8_matmul_forward(got.data(), x.data(), quantize_int8(w.data(), k, m, WeightLayout::kKM), b.data(), n,
                      gelu.data());
  std::vector<float> gelu_after(exact.size());
  gelu_forward(gelu_after.data(), got.data(), n * m);
  EXPECT_TRUE(same_bits(gelu, gelu_after));
  double err = 0, size = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    err += (got[i] - exact[i]) * (got[i] - exact[i]);
    size += exact[i] * exact[i];
  }
  EXPECT_LT(std::sqrt(err / size), 0.02);
  EXPECT_GT(std::sqrt(err / size), 0.0);  // it is a quantized product, not the float one
}

TEST(Int8Matmul, ZeroChannelsAndRowsGiveTheBiasAndNonFiniteInputPropagates) {
  const int64_t n = 2, k = 70, m = 5;
  std::vector<float> x(static_cast<size_t>(n * k), 0.0f), w = normal(k * m, 9), b = {1, 2, 3, 4, 5};
  for (int64_t p = 0; p < k; ++p) w[p * m + 2] = 0;  // channel 2 all zero
  for (int64_t p = 0; p < k; ++p) x[k + p] = 1.0f;   // row 1 ones, row 0 zeros
  const Int8Weight q = quantize_int8(w.data(), k, m, WeightLayout::kKM);
  EXPECT_EQ(q.scale[2], 0.0f);
  std::vector<float> out(static_cast<size_t>(n * m));
  int8_matmul_forward(out.data(), x.data(), q, b.data(), n);
  for (int64_t j = 0; j < m; ++j) EXPECT_EQ(out[j], b[j]);
  EXPECT_EQ(out[m + 2], 3.0f);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    x[3] = bad;
    int8_matmul_forward(out.data(), x.data(), q, b.data(), n);
    for (int64_t j = 0; j < m; ++j) EXPECT_TRUE(std::isnan(out[j])) << bad << " channel " << j;
    EXPECT_EQ(out[m + 2], 3.0f) << "the other row";
  }
}

// A channel read back (an embedding's row) is its quantized values times its scale, in
// order, whatever the tile layout: against the reference's quantization of the same row.
TEST(Int8Matmul, DequantizedChannelIsItsValuesTimesItsScale) {
  const int64_t k = 70, m = 67;
  const auto w = normal(k * m, 10);
  const Int8Weight q = quantize_int8(w.data(), k, m, WeightLayout::kMK);
  std::vector<int8_t> want(static_cast<size_t>(k));
  std::vector<float> got(static_cast<size_t>(k));
  for (int64_t j : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, m - 1}) {
    const float s = reference::quantize_int8_row(w.data() + j * k, k, 1, want.data());
    dequantize_channel(q, j, got.data());
    for (int64_t p = 0; p < k; ++p) ASSERT_EQ(got[p], static_cast<float>(want[p]) * s) << "channel " << j << " p " << p;
  }
}

TEST(Int8Matmul, UnsupportedPathIsRefusedByName) {
  RestorePath restore;
  for (Int8Path path : {Int8Path::kVnni, Int8Path::kAvx2}) {
    if (!int8_path_supported(path)) {
      EXPECT_THROW(set_int8_path(path), Error);
    }
  }
  EXPECT_NO_THROW(set_int8_path(Int8Path::kGeneric));
}

}  // namespace
}  // namespace loom::kernels
