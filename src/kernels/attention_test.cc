// The attention kernels against their plain-loop references and finite differences:
// blocked with an online softmax over any number of blocks, large scores, and one-token
// decoding against a (paged) cache in f32 and bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kernels_testing.h"
#include "kernels/precision.h"
#include "kernels/reference/reference.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

namespace ref = reference;

// Fast attention (blocked, online softmax) in double (exact up to summation order) and
// float against the reference; lse starts as garbage, which forward must overwrite.
void expect_attention_matches_reference(int64_t b, int64_t t, int64_t c, int64_t nh,
                                        const std::vector<double>& qkv, const std::vector<double>& dy,
                                        const std::vector<double>& y, const std::vector<double>& lse,
                                        const std::vector<double>& dqkv) {
  std::vector<double> y2(b * t * c), lse2(b * nh * t, 7.0), dq2(b * t * 3 * c, 7.0);
  attention_forward(y2.data(), lse2.data(), qkv.data(), b, t, c, nh);
  attention_backward(dq2.data(), dy.data(), qkv.data(), y2.data(), lse2.data(), b, t, c, nh);
  EXPECT_LT(rel_err(y2, y), 1e-12);
  EXPECT_LT(rel_err(lse2, lse), 1e-12);
  EXPECT_LT(rel_err(dq2, dqkv), 1e-12);
  auto qf = to_f32(qkv), dyf = to_f32(dy);
  std::vector<float> yf(b * t * c), lf(b * nh * t, 7.0f), dqf(b * t * 3 * c, 7.0f);
  attention_forward(yf.data(), lf.data(), qf.data(), b, t, c, nh);
  attention_backward(dqf.data(), dyf.data(), qf.data(), yf.data(), lf.data(), b, t, c, nh);
  EXPECT_LT(rel_err(yf, y), 2e-5);
  EXPECT_LT(rel_err(lf, lse), 2e-5);
  EXPECT_LT(rel_err(dqf, dqkv), 2e-5);
}

void expect_attention_right(int64_t b, int64_t t, int64_t c, int64_t nh, const std::vector<double>& qkv,
                            const std::vector<double>& dy) {
  std::vector<double> y(b * t * c), lse(b * nh * t), dqkv(b * t * 3 * c);
  ref::attention_forward(y.data(), lse.data(), qkv.data(), b, t, c, nh);
  ref::attention_backward(dqkv.data(), dy.data(), qkv.data(), y.data(), lse.data(), b, t, c, nh);
  expect_attention_matches_reference(b, t, c, nh, qkv, dy, y, lse, dqkv);
}

TEST(Kernels, Attention) {
  const int64_t b = 2, t = 5, c = 12, nh = 3;
  auto qkv = randn(b * t * 3 * c, 11), dy = randn(b * t * c, 12);
  std::vector<double> y(b * t * c), lse(b * nh * t), dqkv(b * t * 3 * c);
  ref::attention_forward(y.data(), lse.data(), qkv.data(), b, t, c, nh);
  ref::attention_backward(dqkv.data(), dy.data(), qkv.data(), y.data(), lse.data(), b, t, c, nh);
  auto fwd = [&](const std::vector<double>& q) {
    std::vector<double> o(b * t * c), l(b * nh * t);
    ref::attention_forward(o.data(), l.data(), q.data(), b, t, c, nh);
    return o;
  };
  EXPECT_LT(rel_err(dqkv, numeric_grad(qkv, dy, fwd)), 1e-6);
  expect_attention_right(b, t, c, nh, qkv, dy);
}

// T spanning several 64-row and 256-column blocks, the last ones partial, and exactly
// whole ones: the online softmax's rescaling across column blocks and the block sums of
// backward must equal the reference exactly where it matters (double) and within float
// rounding.
TEST(Kernels, AttentionAcrossBlocks) {
  for (int64_t t : {150, 64, 65, 256, 300, 576}) {
    SCOPED_TRACE(t);
    const int64_t b = 1, c = 16, nh = 2;
    expect_attention_right(b, t, c, nh, randn(b * t * 3 * c, 31), randn(b * t * c, 32));
  }
}

// Large scores whose row maximum moves by many units from one column block to the next
// (the keys grow along the sequence): the running sum is rescaled by e^-40 and less, and
// must neither overflow nor lose the earlier blocks where they still count.
TEST(Kernels, AttentionOnlineSoftmaxWithLargeScores) {
  const int64_t b = 1, t = 700, c = 8, nh = 1;
  auto qkv = randn(b * t * 3 * c, 33);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t d = 0; d < c; ++d) {
      qkv[i * 3 * c + d] = 1.0 + 0.1 * qkv[i * 3 * c + d];                    // q
      qkv[i * 3 * c + c + d] = 0.03 * static_cast<double>(i) + qkv[i * 3 * c + c + d];  // k
    }
  expect_attention_right(b, t, c, nh, qkv, randn(b * t * c, 34));
}

// Mixed precision's attention: the output rounded as each row is finished (and its bits
// written beside it), and the backward
// from qkv and the output held in 16 bits with dqkv rounded per head, give the bits of the
// passes they replace (forward then round_to; load_half, backward, round_to), for bf16 and
// f16 operands (and the backward's f32 products of 16-bit inputs), on Loom's backend (packed
// from the bits) and OpenBLAS's (f32 copies), across key blocks (T 300) and whole ones, on
// one thread and two.
TEST(Kernels, AttentionRoundedAndFromBitsEqualsItsPasses) {
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2})
    for (DType format : {DType::kBF16, DType::kF16})
      for (int64_t t : {int64_t{300}, int64_t{64}}) {
        omp_set_num_threads(threads);
        SCOPED_TRACE(cat(dtype_name(format), " t=", t, " threads=", threads));
        const int64_t b = 2, c = 32, nh = 2;
        std::vector<float> qkv = to_f32(randn(b * t * 3 * c, 51)), dy = to_f32(randn(b * t * c, 52));
        round_to(format, qkv.data(), static_cast<int64_t>(qkv.size()));
        std::vector<float> want_y(b * t * c), lse(b * nh * t), got_y(b * t * c), got_lse(b * nh * t);
        attention_forward(want_y.data(), lse.data(), qkv.data(), b, t, c, nh, format);
        round_to(format, want_y.data(), b * t * c);
        std::vector<uint16_t> got_y_bits(want_y.size());
        attention_forward(got_y.data(), got_lse.data(), qkv.data(), b, t, c, nh, format, format, got_y_bits.data());
        EXPECT_TRUE(same(got_y, want_y) && same(got_lse, lse));
        std::vector<uint16_t> qkv_bits(qkv.size()), y_bits(want_y.size());
        store_half(format, qkv_bits.data(), qkv.data(), static_cast<int64_t>(qkv.size()));
        store_half(format, y_bits.data(), want_y.data(), static_cast<int64_t>(want_y.size()));
        EXPECT_TRUE(got_y_bits == y_bits);
        // the bits alone, from qkv's bits (Loom's packs, and OpenBLAS's f32 copy) or its values,
        // against that backend's own passes: OpenBLAS's Haswell and Zen sgemm kernels do not sum
        // k in Loom's order, so their scores, and the bits, may differ from Loom's (Zen 5, AVX2)
        for (GemmBackend backend : {GemmBackend::kLoom, GemmBackend::kOpenBlas}) {
          set_gemm_backend(backend);
          std::vector<float> own_y(want_y.size()), own_lse(lse.size());
          attention_forward(own_y.data(), own_lse.data(), qkv.data(), b, t, c, nh, format);
          std::vector<uint16_t> own_bits(want_y.size());
          store_half(format, own_bits.data(), own_y.data(), static_cast<int64_t>(own_y.size()));
          std::vector<uint16_t> only_bits(want_y.size(), 0x7777), from_bits(want_y.size(), 0x7777);
          std::vector<float> only_lse(lse.size()), bits_lse(lse.size());
          attention_forward(static_cast<float*>(nullptr), only_lse.data(), qkv.data(), b, t, c, nh, format, format,
                            only_bits.data());
          attention_forward_bits(from_bits.data(), bits_lse.data(), qkv_bits.data(), format, b, t, c, nh, format,
                                 format);
          EXPECT_TRUE(only_bits == own_bits && same(only_lse, own_lse)) << "backend " << static_cast<int>(backend);
          EXPECT_TRUE(from_bits == own_bits && same(bits_lse, own_lse)) << "backend " << static_cast<int>(backend);
        }
        // The backward from the bits: packed from them (Loom, products in the format), or from
        // f32 copies (OpenBLAS; f32 products of the values); dqkv in f32, or straight into 16
        // bits (the bits of store_half over the f32 dqkv).
        for (GemmBackend backend : {GemmBackend::kLoom, GemmBackend::kOpenBlas})
          for (DType operands : {format, DType::kF32}) {
            set_gemm_backend(backend);
            const std::string where = cat("backend ", static_cast<int>(backend), " operands ", dtype_name(operands));
            std::vector<float> want(qkv.size()), got(qkv.size(), 7.0f);
            attention_backward(want.data(), dy.data(), qkv.data(), want_y.data(), lse.data(), b, t, c, nh, operands);
            round_to(format, want.data(), static_cast<int64_t>(want.size()));
            attention_backward_bits(got.data(), nullptr, dy.data(), qkv_bits.data(), y_bits.data(), format, lse.data(),
                                    b, t, c, nh, operands, format);
            EXPECT_TRUE(same(got, want)) << where;
            std::vector<uint16_t> want_bits(qkv.size()), got_bits(qkv.size(), 0x7777);
            store_half(format, want_bits.data(), want.data(), static_cast<int64_t>(want.size()));
            attention_backward_bits(nullptr, got_bits.data(), dy.data(), qkv_bits.data(), y_bits.data(), format,
                                    lse.data(), b, t, c, nh, operands, format);
            EXPECT_TRUE(got_bits == want_bits) << where;
          }
        set_gemm_backend(GemmBackend::kLoom);
      }
  omp_set_num_threads(saved);
}

// Decoding with a key/value cache: a prefill of 5 positions, then one position at a time,
// gives the rows of the full causal attention; the fast kernel equals its reference twin.
// The cache is in pages of 4 positions, each its own allocation, in reverse order. Head
// sizes of 4 and 20 take the scalar path, 16 to 128 the vector one (c a multiple of 256 or
// not, up to 16 heads, and 20 heads: a second group of lanes partly filled). Of the vector
// shapes, 1, 2, 4, 8, 12, 16 and 20 heads score whole blocks of rows (12 and 20: 4 rows, 3
// and 5 folds of 16 scores), with a last few rows done pair by pair; 3 and 6 heads go pair
// by pair throughout.
struct DecodeShape {
  int64_t c, nh;
};

class AttentionDecode : public ::testing::TestWithParam<DecodeShape> {};

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionDecode,
                         ::testing::Values(DecodeShape{16, 4}, DecodeShape{40, 2}, DecodeShape{64, 4},
                                           DecodeShape{96, 3}, DecodeShape{256, 4}, DecodeShape{256, 2},
                                           DecodeShape{384, 6}, DecodeShape{320, 20}, DecodeShape{32, 1},
                                           DecodeShape{128, 8}, DecodeShape{256, 16}, DecodeShape{192, 12}),
                         [](const auto& info) {
                           char name[32];
                           std::snprintf(name, sizeof name, "c%ld_nh%ld", static_cast<long>(info.param.c),
                                         static_cast<long>(info.param.nh));
                           return std::string(name);
                         });

TEST_P(AttentionDecode, EqualsTheFullCausalAttention) {
  const int64_t t = 21, c = GetParam().c, nh = GetParam().nh, prefill = 5;
  auto qkv = randn(t * 3 * c, 41);
  std::vector<double> y(t * c), lse(nh * t);
  ref::attention_forward(y.data(), lse.data(), qkv.data(), 1, t, c, nh);
  std::vector<double> kc(t * c), vc(t * c);
  for (int64_t j = 0; j < t; ++j)
    for (int64_t d = 0; d < c; ++d) kc[j * c + d] = qkv[j * 3 * c + c + d], vc[j * c + d] = qkv[j * 3 * c + 2 * c + d];
  auto decode = [&](auto kernel, auto zero) {
    using T = decltype(zero);
    constexpr int64_t kPage = 4;
    const int64_t pages = (t + kPage - 1) / kPage;
    std::vector<std::vector<T>> kmem(pages, std::vector<T>(kPage * c)), vmem(pages, std::vector<T>(kPage * c));
    std::vector<const T*> kp(pages), vp(pages);
    for (int64_t p = 0; p < pages; ++p) {
      kp[p] = kmem[pages - 1 - p].data();  // page p lives in the p-th allocation from the end
      vp[p] = vmem[pages - 1 - p].data();
      for (int64_t j = p * kPage; j < std::min(t, (p + 1) * kPage); ++j)
        for (int64_t d = 0; d < c; ++d) {
          kmem[pages - 1 - p][(j % kPage) * c + d] = static_cast<T>(kc[j * c + d]);
          vmem[pages - 1 - p][(j % kPage) * c + d] = static_cast<T>(vc[j * c + d]);
        }
    }
    std::vector<T> q(qkv.begin(), qkv.end()), out(t * c);
    kernel(out.data(), q.data(), 3 * c, kp.data(), vp.data(), kPage, 0, prefill, c, nh);
    for (int64_t i = prefill; i < t; ++i)
      kernel(out.data() + i * c, q.data() + i * 3 * c, 3 * c, kp.data(), vp.data(), kPage, i, 1, c, nh);
    return std::vector<double>(out.begin(), out.end());
  };
  EXPECT_LT(rel_err(decode(ref::attention_decode<double>, 0.0), y), 1e-14);
  EXPECT_LT(rel_err(decode(attention_decode<double>, 0.0), y), 1e-14);
  EXPECT_LT(rel_err(decode(attention_decode<float>, 0.0f), y), 2e-6);
}

// Keys and values kept in bf16 give, bit for bit, what the f32 kernel gives on their values
// widened to f32: the widening is exact and nothing else changes (vector and scalar paths).
TEST_P(AttentionDecode, Bf16KeysAndValuesGiveTheBitsOfTheirWidenedValues) {
  const int64_t t = 21, c = GetParam().c, nh = GetParam().nh, prefill = 6;
  constexpr int64_t kPage = 8;
  const int64_t pages = (t + kPage - 1) / kPage;
  const auto qkv = randn(t * 3 * c, 43);
  std::vector<float> q(qkv.begin(), qkv.end());
  std::vector<std::vector<uint16_t>> khalf(pages, std::vector<uint16_t>(kPage * c)), vhalf = khalf;
  std::vector<std::vector<float>> kwide(pages, std::vector<float>(kPage * c)), vwide = kwide;
  for (int64_t j = 0; j < t; ++j)
    for (int64_t d = 0; d < c; ++d) {
      const int64_t p = j / kPage, at = (j % kPage) * c + d;
      khalf[p][at] = f32_to_bf16(q[j * 3 * c + c + d]);
      vhalf[p][at] = f32_to_bf16(q[j * 3 * c + 2 * c + d]);
      kwide[p][at] = bf16_to_f32(khalf[p][at]);
      vwide[p][at] = bf16_to_f32(vhalf[p][at]);
    }
  auto run = [&](auto& kmem, auto& vmem) {
    using S = std::remove_cvref_t<decltype(kmem[0][0])>;
    std::vector<const S*> kp, vp;
    for (int64_t p = 0; p < pages; ++p) kp.push_back(kmem[p].data()), vp.push_back(vmem[p].data());
    std::vector<float> out(t * c);
    attention_decode(out.data(), q.data(), 3 * c, kp.data(), vp.data(), kPage, 0, prefill, c, nh);
    for (int64_t i = prefill; i < t; ++i)
      attention_decode(out.data() + i * c, q.data() + i * 3 * c, 3 * c, kp.data(), vp.data(), kPage, i, 1, c, nh);
    return out;
  };
  const std::vector<float> half = run(khalf, vhalf), wide = run(kwide, vwide);
  EXPECT_EQ(std::memcmp(half.data(), wide.data(), half.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace loom::kernels
