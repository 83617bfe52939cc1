// Mixed precision's conversions (kernels/precision.h) against loom/core/dtype.h's scalar ones,
// their reference twins: every exponent, the rounding boundaries, subnormals, overflow,
// infinities and NaN, on the pool's threads and off them.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "kernels/precision.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"

namespace loom::kernels {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// f32 bit patterns: a sweep over all of them (every 4099th: each exponent, both signs, many
// mantissas), and for each 16-bit value its neighbours and the midpoints to the next one,
// where ties to even decide.
std::vector<float> hard_values() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x10000; ++h)
    for (int shift : {13, 16}) {  // f16 keeps 13 fewer mantissa bits than f32, bf16 16
      const uint32_t base = shift == 16 ? h << 16 : bits(f16_to_f32(static_cast<uint16_t>(h)));
      const uint32_t half = uint32_t{1} << (shift - 1);
      for (uint32_t u : {base, base + half, base + half - 1, base + half + 1, base - 1}) v.push_back(std::bit_cast<float>(u));
    }
  for (float x : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65519.99f, 65520.0f, -65520.0f, 5.96e-8f, 2.98e-8f})
    v.push_back(x);
  return v;
}

TEST(Precision, ConversionsEqualTheScalarOnesBitForBit) {
  const std::vector<float> x = hard_values();
  const auto n = static_cast<int64_t>(x.size());
  for (int threads : {1, 2}) {
    set_compute_threads(threads);
    for (DType format : {DType::kBF16, DType::kF16}) {
      const bool bf = format == DType::kBF16;
      std::vector<float> rounded = x, back(x.size());
      std::vector<uint16_t> half(x.size());
      round_to(format, rounded.data(), n);
      store_half(format, half.data(), x.data(), n);
      load_half(format, back.data(), half.data(), n);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = bf ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
        const uint32_t want_value = bits(bf ? bf16_to_f32(want) : f16_to_f32(want));
        if (half[i] != want || bits(rounded[i]) != want_value || bits(back[i]) != want_value) {
          if (++bad <= 5)
            ADD_FAILURE() << dtype_name(format) << " of f32 bits " << std::hex << bits(x[i]) << ": got " << half[i]
                          << ", want " << want;
        }
      }
      EXPECT_EQ(bad, 0) << dtype_name(format) << " at " << threads << " thread(s)";
    }
  }
  set_compute_threads(1);
  // f32 is no rounding at all.
  std::vector<float> same = x;
  round_to(DType::kF32, same.data(), n);
  EXPECT_EQ(std::memcmp(same.data(), x.data(), x.size() * sizeof(float)), 0);
}

TEST(Precision, F16OverflowsToInfinityAndKeepsSubnormals) {
  float v[] = {65504.0f, 65520.0f, -1e6f, 1e-7f, 3e-8f, 2.9e-8f};
  round_to(DType::kF16, v, 6);
  EXPECT_EQ(v[0], 65504.0f);
  EXPECT_TRUE(std::isinf(v[1]) && v[1] > 0);
  EXPECT_TRUE(std::isinf(v[2]) && v[2] < 0);
  EXPECT_EQ(v[3], 2 * std::ldexp(1.0f, -24));  // 1e-7 / 2^-24 = 1.68: two subnormal units
  EXPECT_EQ(v[4], std::ldexp(1.0f, -24));      // above half a unit: rounds up to one
  EXPECT_EQ(v[5], 0.0f);                       // below half a unit: vanishes (what loss scaling prevents)
}

// What the GEMM's packers multiply for bf16 bits: the operand of the value the bits hold, for
// every one of the 65,536 (subnormals of both signs read as signed zeros, NaNs made quiet).
TEST(Precision, Bf16OperandOfBitsIsTheOperandOfTheirValue) {
  int flushed = 0, quieted = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const uint32_t got = std::bit_cast<uint32_t>(bf16_operand_of_bits(bits));
    const uint32_t want = std::bit_cast<uint32_t>(bf16_operand(bf16_value(bits)));
    ASSERT_EQ(got, want) << "bits 0x" << std::hex << h;
    flushed += (h & 0x7f80u) == 0 && (h & 0x7fu) != 0;
    quieted += got != h << 16 && (h & 0x7f80u) != 0;
  }
  EXPECT_EQ(flushed, 2 * 127);
  EXPECT_EQ(quieted, 2 * 63);  // signalling NaNs: quiet bit clear, payload not zero
}

// The same for f16 bits: every one of the 65,536 is its own value (subnormals kept), but a
// NaN, which becomes f16_bits' one quiet NaN of its sign.
TEST(Precision, F16OperandOfBitsIsTheOperandOfTheirValue) {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const uint32_t got = std::bit_cast<uint32_t>(f16_operand_of_bits(bits));
    const uint32_t want = std::bit_cast<uint32_t>(f16_operand(f16_value(bits)));
    ASSERT_EQ(got, want) << "bits 0x" << std::hex << h;
    if ((h & 0x7fffu) > 0x7c00u) {
      ++nans;
      EXPECT_EQ(got, (h & 0x8000u) << 16 | 0x7fc00000u) << "bits 0x" << std::hex << h;
    } else {
      EXPECT_EQ(got, std::bit_cast<uint32_t>(f16_value(bits))) << "bits 0x" << std::hex << h;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

// The GELU backward of mixed precision's MLP reads its input as 16-bit bits and rounds dh in
// the same pass: the bits of load_half, gelu_backward and round_to one after the other, for
// lengths across its 512-value blocks and the pool's chunks, on one thread and two.
TEST(Precision, GeluBackwardOnBitsEqualsLoadGeluRound) {
  for (int threads : {1, 2}) {
    set_compute_threads(threads);
    for (DType format : {DType::kBF16, DType::kF16})
      for (int64_t n : {int64_t{1}, int64_t{511}, int64_t{513}, int64_t{5000}, int64_t{70001}}) {
        Rng r(static_cast<uint64_t>(n) * 7 + static_cast<uint64_t>(format));
        std::vector<float> x(n), dy(n);
        for (int64_t i = 0; i < n; ++i) {
          x[i] = static_cast<float>(3 * r.normal());
          dy[i] = static_cast<float>(r.normal());
        }
        std::vector<uint16_t> kept(n);
        store_half(format, kept.data(), x.data(), n);
        std::vector<float> values(n), want(n), got(n);
        load_half(format, values.data(), kept.data(), n);
        gelu_backward(want.data(), values.data(), dy.data(), n);
        round_to(format, want.data(), n);
        gelu_backward_bits(got.data(), kept.data(), format, dy.data(), n, format);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << dtype_name(format) << " n=" << n << " threads=" << threads;
        gelu_backward_bits(got.data(), kept.data(), format, dy.data(), n, DType::kF32);  // not rounded
        gelu_backward(want.data(), values.data(), dy.data(), n);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << dtype_name(format) << " n=" << n;
      }
  }
  set_compute_threads(1);
}

// Mixed precision's GELU reads a table of each format's 65,536 values (pointwise.cc): every
// one of them, forward (rounded) and backward, against the f32 loops over the same values.
// Bit for bit; where the f32 loop gives a NaN (infinite or NaN inputs), a NaN.
TEST(Precision, GeluTablesEqualTheF32LoopsOnEvery16BitValue) {
  const auto same = [](float got, float want) { return std::isnan(want) ? std::isnan(got) : bits(got) == bits(want); };
  for (DType format : {DType::kBF16, DType::kF16}) {
    const int64_t n = 65536;
    std::vector<uint16_t> every(n);
    for (int64_t i = 0; i < n; ++i) every[i] = static_cast<uint16_t>(i);
    std::vector<float> x(n), dy(n), want(n), got(n);
    load_half(format, x.data(), every.data(), n);
    Rng r(5);
    for (int64_t i = 0; i < n; ++i) dy[i] = static_cast<float>(r.normal());
    gelu_forward_serial(want.data(), x.data(), n);
    round_to(format, want.data(), n);
    gelu_forward_half(format, got.data(), x.data(), n);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += same(got[i], want[i]) ? 0 : 1;
    EXPECT_EQ(wrong, 0) << dtype_name(format) << " forward";
    // From the bits themselves, as an epilogue that writes them reads them: the bits the
    // forward gives their values (a NaN's own bits, whatever its payload, give a NaN).
    std::vector<uint16_t> got_bits(n), want_bits(n);
    gelu_forward_half_of_bits(format, got_bits.data(), every.data(), n);
    gelu_forward_half_bits(format, want_bits.data(), x.data(), n);
    load_half(format, got.data(), got_bits.data(), n);
    load_half(format, want.data(), want_bits.data(), n);
    wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += same(got[i], want[i]) ? 0 : 1;
    EXPECT_EQ(wrong, 0) << dtype_name(format) << " forward from bits";
    gelu_backward(want.data(), x.data(), dy.data(), n);
    gelu_backward_bits(got.data(), every.data(), format, dy.data(), n, DType::kF32);
    wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += same(got[i], want[i]) ? 0 : 1;
    EXPECT_EQ(wrong, 0) << dtype_name(format) << " backward";
  }
}

// Mixed precision's MLP gradient in 16 bits (matmul.h): c_proj's input gradient taken
// through the GELU into bits, then c_fc's input and weight gradients and bias from those
// bits, each the bits of the f32 path it replaces (matmul_backward rounding its dinp,
// gelu_backward_bits, store_half; matmul_backward on the values the bits hold), on shapes
// below and above the products' threading threshold, on one thread and two.
TEST(Precision, MlpGradientInBitsEqualsTheF32Path) {
  for (int threads : {1, 2}) {
    set_compute_threads(threads);
    for (DType format : {DType::kBF16, DType::kF16})
      for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 3}, {300, 70, 90}, {129, 256, 64}}) {
        const std::string what = cat(dtype_name(format), " n=", n, " k=", k, " m=", m, " threads=", threads);
        Rng r(static_cast<uint64_t>(n * k * m) + static_cast<uint64_t>(format));
        const auto randoms = [&](int64_t count, double scale) {
          std::vector<float> v(static_cast<size_t>(count));
          for (float& x : v) x = static_cast<float>(scale * r.normal());
          return v;
        };
        const auto stored = [&](const std::vector<float>& v) {
          std::vector<uint16_t> b(v.size());
          store_half(format, b.data(), v.data(), static_cast<int64_t>(v.size()));
          return b;
        };
        const auto values = [&](const std::vector<uint16_t>& b) {
          std::vector<float> v(b.size());
          load_half(format, v.data(), b.data(), static_cast<int64_t>(b.size()));
          return v;
        };
        // c_proj: dout (n, m) f32, weight (k, m); the GELU's input h (n, k) in bits.
        const std::vector<float> dout = randoms(n * m, 1), w = randoms(k * m, 0.3);
        const std::vector<uint16_t> h = stored(randoms(n * k, 2));
        std::vector<float> dinp(n * k), want_dh(n * k), scratch(n * k);
        matmul_backward<float>(dinp.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), n, k, m,
                               WeightLayout::kKM, format, format);
        gelu_backward_bits(want_dh.data(), h.data(), format, dinp.data(), n * k, format);
        std::vector<uint16_t> dh(n * k);
        matmul_backward_gelu_bits(dh.data(), scratch.data(), dout.data(), w.data(), h.data(), n, k, m, format);
        EXPECT_TRUE(stored(want_dh) == dh) << what;
        // c_fc: dout (n, k) = dh in bits, weight (m, k) read as (in m, out k), input x (n, m) in bits.
        const std::vector<float> dh_values = values(dh), w2 = randoms(m * k, 0.3);
        const std::vector<uint16_t> x = stored(randoms(n * m, 1));
        std::vector<float> want_dx(n * m), got_dx(n * m), want_dw = randoms(m * k, 1), got_dw = want_dw,
                                                          want_db = randoms(k, 1), got_db = want_db;
        matmul_backward<float>(want_dx.data(), want_dw.data(), want_db.data(), dh_values.data(), values(x).data(),
                               w2.data(), n, m, k, WeightLayout::kKM, format, format);
        matmul_dinp_bits(got_dx.data(), dh.data(), w2.data(), n, m, k, format, format);
        matmul_weight_grad_bits(got_dw.data(), got_db.data(), dh.data(), x.data(), format, n, m, k);
        EXPECT_EQ(std::memcmp(got_dx.data(), want_dx.data(), got_dx.size() * sizeof(float)), 0) << what << " dx";
        EXPECT_EQ(std::memcmp(got_dw.data(), want_dw.data(), got_dw.size() * sizeof(float)), 0) << what << " dw";
        EXPECT_EQ(std::memcmp(got_db.data(), want_db.data(), got_db.size() * sizeof(float)), 0) << what << " db";
      }
  }
  set_compute_threads(1);
}

// Mixed precision's LayerNorms in one pass per row (layernorm.h): the residual add rounded,
// the LayerNorm and its output's rounding (was add_round, layernorm_forward, round_to; also
// written as bits only, with the sum's bits beside: store_half of those), and
// the backward from the input's 16-bit bits with its d(input) rounded (was load_half,
// layernorm_backward, round_to), and with the residual's gradient added (was add_round, or
// add_forward in f32, after): the bits of the passes they replace, dweight and dbias
// included, with and without the residual, on one thread and two.
TEST(Precision, LayerNormInOnePassEqualsItsPasses) {
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (int threads : {1, 2}) {
    set_compute_threads(threads);
    for (DType format : {DType::kBF16, DType::kF16})
      for (auto [n, c] : {std::pair<int64_t, int64_t>{5, 7}, {300, 96}, {64, 256}}) {
        const std::string what = cat(dtype_name(format), " n=", n, " c=", c, " threads=", threads);
        Rng r(static_cast<uint64_t>(n * c) + static_cast<uint64_t>(format));
        const auto randoms = [&](int64_t count, double scale, double shift) {
          std::vector<float> v(static_cast<size_t>(count));
          for (float& x : v) x = static_cast<float>(shift + scale * r.normal());
          return v;
        };
        const std::vector<float> x0 = randoms(n * c, 2, 0.5), residual = randoms(n * c, 1, 0), w = randoms(c, 0.5, 1),
                                 b = randoms(c, 0.2, 0), dy = randoms(n * c, 1, 0);
        // Forward, with the residual and without.
        std::vector<float> want_x = x0, want_y(n * c), want_mean(n), want_rstd(n);
        add_round(want_x.data(), want_x.data(), residual.data(), n * c, format);
        layernorm_forward(want_y.data(), want_mean.data(), want_rstd.data(), want_x.data(), w.data(), b.data(), n, c);
        round_to(format, want_y.data(), n * c);
        std::vector<float> got_x = x0, got_y(n * c), got_mean(n), got_rstd(n);
        add_layernorm_forward(got_x.data(), residual.data(), got_y.data(), got_mean.data(), got_rstd.data(), w.data(),
                              b.data(), n, c, format);
        EXPECT_TRUE(same(got_x, want_x) && same(got_y, want_y) && same(got_mean, want_mean) &&
                    same(got_rstd, want_rstd))
            << what << " add";
        std::vector<float> plain_y(n * c);
        layernorm_forward(plain_y.data(), got_mean.data(), got_rstd.data(), want_x.data(), w.data(), b.data(), n, c,
                          format);
        EXPECT_TRUE(same(plain_y, want_y)) << what;
        // The same written only as bits (the output), and beside the sum (its bits).
        std::vector<uint16_t> want_y_bits(n * c), want_x_bits(n * c), y_bits(n * c), sum_bits(n * c);
        store_half(format, want_y_bits.data(), want_y.data(), n * c);
        store_half(format, want_x_bits.data(), want_x.data(), n * c);
        const auto statistics = [&] { return same(got_mean, want_mean) && same(got_rstd, want_rstd); };
        got_mean.assign(n, 0);
        got_rstd.assign(n, 0);
        layernorm_forward(static_cast<float*>(nullptr), got_mean.data(), got_rstd.data(), want_x.data(), w.data(),
                          b.data(), n, c, format, y_bits.data());
        EXPECT_TRUE(y_bits == want_y_bits && statistics()) << what << " bits";
        for (bool with_sum_bits : {true, false}) {
          std::vector<float> sum = x0;
          y_bits.assign(n * c, 0);
          sum_bits.assign(n * c, 0);
          got_mean.assign(n, 0);
          got_rstd.assign(n, 0);
          add_layernorm_forward(sum.data(), residual.data(), static_cast<float*>(nullptr), got_mean.data(),
                                got_rstd.data(), w.data(), b.data(), n, c, format, y_bits.data(),
                                with_sum_bits ? sum_bits.data() : nullptr);
          EXPECT_TRUE(same(sum, want_x) && y_bits == want_y_bits && statistics() &&
                      (!with_sum_bits || sum_bits == want_x_bits))
              << what << " add, bits" << (with_sum_bits ? " and the sum's" : "");
        }
        // Backward from the input's bits.
        std::vector<uint16_t> x_bits(n * c);
        store_half(format, x_bits.data(), want_x.data(), n * c);
        std::vector<float> x_values(n * c);
        load_half(format, x_values.data(), x_bits.data(), n * c);
        std::vector<float> want_dx(n * c), want_dw = randoms(c, 1, 0), want_db = randoms(c, 1, 0);
        std::vector<float> got_dx(n * c), got_dw = want_dw, got_db = want_db;
        layernorm_backward(want_dx.data(), want_dw.data(), want_db.data(), dy.data(), x_values.data(), w.data(),
                           want_mean.data(), want_rstd.data(), n, c);
        round_to(format, want_dx.data(), n * c);
        layernorm_backward_bits(got_dx.data(), got_dw.data(), got_db.data(), dy.data(), x_bits.data(), format, w.data(),
                                want_mean.data(), want_rstd.data(), n, c, format);
        EXPECT_TRUE(same(got_dx, want_dx)) << what << " dx";
        EXPECT_TRUE(same(got_dw, want_dw) && same(got_db, want_db)) << what << " dweight, dbias";
        // And with the residual's gradient added to each row (was add_round after).
        add_round(want_dx.data(), want_dx.data(), residual.data(), n * c, format);
        layernorm_backward_bits(got_dx.data(), got_dw.data(), got_db.data(), dy.data(), x_bits.data(), format, w.data(),
                                want_mean.data(), want_rstd.data(), n, c, format, residual.data());
        EXPECT_TRUE(same(got_dx, want_dx)) << what << " dx + residual";
        std::vector<float> f32_dx(n * c), f32_dw(c), f32_db(c), f32_want(n * c);
        layernorm_backward(f32_want.data(), f32_dw.data(), f32_db.data(), dy.data(), x_values.data(), w.data(),
                           want_mean.data(), want_rstd.data(), n, c);
        add_forward(f32_want.data(), f32_want.data(), residual.data(), n * c);
        layernorm_backward(f32_dx.data(), f32_dw.data(), f32_db.data(), dy.data(), x_values.data(), w.data(),
                           want_mean.data(), want_rstd.data(), n, c, DType::kF32, residual.data());
        EXPECT_TRUE(same(f32_dx, f32_want)) << what << " f32 dx + residual";
      }
  }
  set_compute_threads(1);
}

}  // namespace
}  // namespace loom::kernels
