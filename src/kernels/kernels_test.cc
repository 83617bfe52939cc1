// Each fast kernel against its plain-loop reference twin, and each reference backward
// against central finite differences in double precision (so the oracle itself is proven).
// Tolerances: f64 fast vs reference 1e-10 relative (only summation order differs);
// f32 fast vs f64 reference 2e-5 relative (f32 rounding over sums of <= 256 terms);
// finite differences 1e-6 relative with step 1e-5 (truncation error O(h^2) ~ 1e-10, and
// rounding ~ 1e-16/h ~ 1e-11 of the output's scale).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/fast_math.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/fixed_sum.h"
#include "kernels/optimizer.h"
#include "kernels/parallel.h"
#include "kernels/pointwise.h"
#include "kernels/reference/reference.h"
#include "loom/core/rng.h"
#include "kernels/kernels_testing.h"
#include "loom_testing.h"

namespace loom::kernels {
namespace {

namespace ref = reference;

class MatmulTest : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(MatmulTest, FastMatchesReferenceAndReferenceMatchesFiniteDifferences) {
  const WeightLayout layout = GetParam();
  const int64_t n = 7, k = 13, m = 5;
  auto x = randn(n * k, 1), w = randn(k * m, 2), b = randn(m, 3), dy = randn(n * m, 4);
  std::vector<double> y(n * m), dx(n * k), dw(k * m, 0), db(m, 0);
  ref::matmul_forward(y.data(), x.data(), w.data(), b.data(), n, k, m, layout);
  ref::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, k, m, layout);

  auto f_x = [&](const std::vector<double>& xx) {
    std::vector<double> o(n * m);
    ref::matmul_forward(o.data(), xx.data(), w.data(), b.data(), n, k, m, layout);
    return o;
  };
  auto f_w = [&](const std::vector<double>& ww) {
    std::vector<double> o(n * m);
    ref::matmul_forward(o.data(), x.data(), ww.data(), b.data(), n, k, m, layout);
    return o;
  };
  auto f_b = [&](const std::vector<double>& bb) {
    std::vector<double> o(n * m);
    ref::matmul_forward(o.data(), x.data(), w.data(), bb.data(), n, k, m, layout);
    return o;
  };
  EXPECT_LT(rel_err(dx, numeric_grad(x, dy, f_x)), 1e-6);
  EXPECT_LT(rel_err(dw, numeric_grad(w, dy, f_w)), 1e-6);
  EXPECT_LT(rel_err(db, numeric_grad(b, dy, f_b)), 1e-6);

  // Fast f64 and f32 against the reference.
  std::vector<double> y64(n * m), dx64(n * k), dw64(k * m, 0), db64(m, 0);
  matmul_forward(y64.data(), x.data(), w.data(), b.data(), n, k, m, layout);
  matmul_backward(dx64.data(), dw64.data(), db64.data(), dy.data(), x.data(), w.data(), n, k, m, layout);
  EXPECT_LT(rel_err(y64, y), 1e-12);
  EXPECT_LT(rel_err(dx64, dx), 1e-12);
  EXPECT_LT(rel_err(dw64, dw), 1e-12);
  EXPECT_LT(rel_err(db64, db), 1e-12);
  auto xf = to_f32(x), wf = to_f32(w), bf = to_f32(b), dyf = to_f32(dy);
  std::vector<float> yf(n * m), dxf(n * k), dwf(k * m, 0), dbf(m, 0);
  matmul_forward(yf.data(), xf.data(), wf.data(), bf.data(), n, k, m, layout);
  matmul_backward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(), n, k, m, layout);
  EXPECT_LT(rel_err(yf, y), 2e-5);
  EXPECT_LT(rel_err(dxf, dx), 2e-5);
  EXPECT_LT(rel_err(dwf, dw), 2e-5);
  EXPECT_LT(rel_err(dbf, db), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MatmulTest, ::testing::Values(WeightLayout::kKM, WeightLayout::kMK));

TEST(Kernels, MatmulHandlesEmptyBatch) {
  std::vector<float> w(6, 1.0f), b(3, 1.0f), dw(6, 0.0f), db(3, 0.0f);
  matmul_forward<float>(nullptr, nullptr, w.data(), b.data(), 0, 2, 3, WeightLayout::kKM);
  matmul_backward<float>(nullptr, dw.data(), db.data(), nullptr, nullptr, w.data(), 0, 2, 3,
                         WeightLayout::kKM);
  EXPECT_EQ(dw, std::vector<float>(6, 0.0f));
}

// The fused product and GELU (matmul_forward's gelu_out, computed in the GEMM's epilogue
// tile by tile): the same bits as the product followed by gelu_forward, whatever the shape
// (1, primes, beyond a tile), thread count, GEMM path or backend; and within the f32
// tolerance of its reference twin (the reference product, then the reference GELU).
TEST(Kernels, MatmulWithGeluFusedEqualsTheTwoPasses) {
  const int saved = omp_get_max_threads();
  for (const auto& shape : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 5}, {97, 64, 131}, {300, 37, 700}}) {
    const int64_t n = shape[0], k = shape[1], m = shape[2];  // not a structured binding: the lambda below uses them
    const auto x = randn(n * k, 1), w = randn(k * m, 2, 0.3), b = randn(m, 3);
    std::vector<double> y(n * m), g(n * m);
    ref::matmul_forward(y.data(), x.data(), w.data(), b.data(), n, k, m, WeightLayout::kKM);
    ref::gelu_forward(g.data(), y.data(), n * m);
    const auto xf = to_f32(x), wf = to_f32(w), bf = to_f32(b);
    auto run = [&](bool fused) {
      std::vector<float> out(n * m), act(n * m);
      matmul_forward(out.data(), xf.data(), wf.data(), bf.data(), n, k, m, WeightLayout::kKM, fused ? act.data() : nullptr);
      if (!fused) gelu_forward(act.data(), out.data(), n * m);
      out.insert(out.end(), act.begin(), act.end());
      return out;
    };
    for (GemmPath path : gemm_supported_paths())
      for (int threads : {1, 2}) {
        set_gemm_path(path);
        omp_set_num_threads(threads);
        const std::vector<float> fused = run(true), apart = run(false);
        EXPECT_EQ(0, std::memcmp(fused.data(), apart.data(), fused.size() * sizeof(float)))
            << gemm_path_name(path) << ", " << threads << " thread(s), n=" << n << " k=" << k << " m=" << m;
        EXPECT_LT(rel_err(std::vector<float>(fused.begin() + n * m, fused.end()), g), 2e-5);
      }
    set_gemm_backend(GemmBackend::kOpenBlas);
    const std::vector<float> fused = run(true), apart = run(false);
    EXPECT_EQ(0, std::memcmp(fused.data(), apart.data(), fused.size() * sizeof(float))) << "OpenBLAS backend";
    set_gemm_backend(GemmBackend::kLoom);
  }
  set_gemm_path(GemmPath::kAuto);
  omp_set_num_threads(saved);
}

// A block's residual added by the product's epilogue (matmul_forward's and
// matmul_forward_half's `residual`): the bits of the product, then add_forward (f32) or
// add_round (mixed precision) over its output, with a bias, on every path, 1 and 2 threads,
// shapes past a tile, and the OpenBLAS backend.
TEST(Kernels, MatmulWithResidualEqualsTheProductThenTheAdd) {
  const int saved = omp_get_max_threads();
  for (const auto& shape : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 5}, {97, 64, 131}, {300, 37, 700}}) {
    const int64_t n = shape[0], k = shape[1], m = shape[2];
    const auto x = to_f32(randn(n * k, 21)), w = to_f32(randn(k * m, 22, 0.3)), b = to_f32(randn(m, 23)),
               r = to_f32(randn(n * m, 24));
    std::vector<uint16_t> x_bits(n * k);
    store_half(DType::kBF16, x_bits.data(), x.data(), n * k);
    // form 0: f32; 1: f32 values, bf16 products and rounding; 2: 16-bit input bits
    const auto run = [&](int form, bool fused) {
      std::vector<float> out(n * m);
      const float* res = fused ? r.data() : nullptr;
      if (form == 2)
        matmul_forward_half(out.data(), nullptr, nullptr, nullptr, x_bits.data(), w.data(), b.data(), n, k, m,
                            DType::kBF16, false, res);
      else
        matmul_forward(out.data(), x.data(), w.data(), b.data(), n, k, m, WeightLayout::kKM, static_cast<float*>(nullptr),
                       form == 1 ? DType::kBF16 : DType::kF32, form == 1 ? DType::kBF16 : DType::kF32, res);
      if (!fused && form == 0) add_forward(out.data(), out.data(), r.data(), n * m);
      if (!fused && form != 0) add_round(out.data(), out.data(), r.data(), n * m, DType::kBF16);
      return out;
    };
    const auto check = [&](const std::string& what) {
      for (int form : {0, 1, 2}) {
        const std::vector<float> fused = run(form, true), apart = run(form, false);
        EXPECT_EQ(0, std::memcmp(fused.data(), apart.data(), fused.size() * sizeof(float)))
            << what << " form " << form << " n=" << n << " k=" << k << " m=" << m;
      }
    };
    for (GemmPath path : gemm_supported_paths())
      for (int threads : {1, 2}) {
        set_gemm_path(path);
        omp_set_num_threads(threads);
        check(cat(gemm_path_name(path), ", ", threads, " thread(s)"));
      }
    set_gemm_backend(GemmBackend::kOpenBlas);
    check("OpenBLAS backend");
    set_gemm_backend(GemmBackend::kLoom);
  }
  set_gemm_path(GemmPath::kAuto);
  omp_set_num_threads(saved);
}

// Mixed precision's forward product into 16-bit storage (matmul_forward_half): out's bits
// and the GELU's, with out kept or only scratch, from f32 values or 16-bit bits, equal
// store_half of matmul_forward's rounded out and gelu_out: bf16 and f16, every path, 1 and
// 2 threads, shapes past a tile.
TEST(Kernels, MatmulForwardHalfBitsEqualStoreHalfOfTheF32Path) {
  const int saved = omp_get_max_threads();
  for (const auto& shape : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 5}, {97, 64, 131}, {300, 37, 700}}) {
    const int64_t n = shape[0], k = shape[1], m = shape[2];
    const auto x = to_f32(randn(n * k, 41)), w = to_f32(randn(k * m, 42, 0.3)), b = to_f32(randn(m, 43));
    for (DType format : {DType::kBF16, DType::kF16}) {
      std::vector<uint16_t> x_bits(n * k);
      store_half(format, x_bits.data(), x.data(), n * k);
      std::vector<float> x_values(n * k);
      load_half(format, x_values.data(), x_bits.data(), n * k);
      for (GemmPath path : gemm_supported_paths())
        for (int threads : {1, 2}) {
          set_gemm_path(path);
          omp_set_num_threads(threads);
          for (bool from_bits : {false, true}) {
            std::vector<float> y(n * m), g(n * m);
            matmul_forward(y.data(), from_bits ? x_values.data() : x.data(), w.data(), b.data(), n, k, m,
                           WeightLayout::kKM, g.data(), format, format);
            std::vector<uint16_t> want_y(n * m), want_g(n * m);
            store_half(format, want_y.data(), y.data(), n * m);
            store_half(format, want_g.data(), g.data(), n * m);
            const float* in = from_bits ? nullptr : x.data();
            const uint16_t* in_bits = from_bits ? x_bits.data() : nullptr;
            const std::string what = cat(dtype_name(format), " ", gemm_path_name(path), " threads=", threads,
                                         " bits=", from_bits, " n=", n, " k=", k, " m=", m);
            for (bool scratch : {false, true}) {
              std::vector<float> out(n * m);
              std::vector<uint16_t> out_bits(n * m), gelu_bits(n * m);
              matmul_forward_half(out.data(), out_bits.data(), gelu_bits.data(), in, in_bits, w.data(), b.data(), n, k,
                                  m, format, scratch);
              EXPECT_TRUE(out_bits == want_y && gelu_bits == want_g) << what << " scratch=" << scratch;
              if (!scratch) {
                EXPECT_EQ(0, std::memcmp(out.data(), y.data(), out.size() * sizeof(float))) << what;
              }
              out_bits.assign(n * m, 0);
              matmul_forward_half(out.data(), out_bits.data(), nullptr, in, in_bits, w.data(), b.data(), n, k, m, format,
                                  scratch);
              EXPECT_TRUE(out_bits == want_y) << what << " out only, scratch=" << scratch;
            }
          }
        }
    }
  }
  set_gemm_path(GemmPath::kAuto);
  omp_set_num_threads(saved);
}

// The bias gradient: dbias += each column's sum over the rows in order (one chain per
// column, from +0), bit for bit, whatever the thread count; f32 gradients and 16-bit ones,
// widths that are not a multiple of a vector or of the thread count, rows past a parallel
// chunk.
TEST(Kernels, BiasGradientSumsEachColumnInRowOrder) {
  const int saved = omp_get_max_threads();
  for (auto [n, m] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 5}, {300, 133}, {2048, 97}}) {
    const auto dy = to_f32(randn(n * m, 31)), x = to_f32(randn(n * 3, 32)), start = to_f32(randn(m, 33));
    std::vector<uint16_t> dy_bits(n * m), x_bits(n * 3);
    store_half(DType::kBF16, dy_bits.data(), dy.data(), n * m);
    store_half(DType::kBF16, x_bits.data(), x.data(), n * 3);
    std::vector<float> want = start, want_bits = start;
    for (int64_t c = 0; c < m; ++c) {
      float sum = 0, sum_bits = 0;
      for (int64_t i = 0; i < n; ++i) {
        sum += dy[i * m + c];
        sum_bits += bf16_value(dy_bits[i * m + c]);
      }
      want[c] += sum;
      want_bits[c] += sum_bits;
    }
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> dw(3 * m), db = start, db_bits = start;
      matmul_backward<float>(nullptr, dw.data(), db.data(), dy.data(), x.data(), dw.data(), n, 3, m, WeightLayout::kKM);
      matmul_weight_grad_bits(dw.data(), db_bits.data(), dy_bits.data(), x_bits.data(), DType::kBF16, n, 3, m);
      EXPECT_EQ(0, std::memcmp(db.data(), want.data(), m * sizeof(float))) << n << " x " << m << ", " << threads;
      EXPECT_EQ(0, std::memcmp(db_bits.data(), want_bits.data(), m * sizeof(float))) << n << " x " << m << " bits, "
                                                                                      << threads;
    }
  }
  omp_set_num_threads(saved);
}

TEST(Kernels, Gelu) {
  const int64_t n = 1001;
  auto x = randn(n, 5, 2.0), dy = randn(n, 6);
  std::vector<double> y(n), dx(n);
  ref::gelu_forward(y.data(), x.data(), n);
  ref::gelu_backward(dx.data(), x.data(), dy.data(), n);
  // Elementwise op: check the derivative per element with the same central difference.
  std::vector<double> fd(n);
  for (int64_t i = 0; i < n; ++i)
    fd[i] = (ref::gelu(x[i] + 1e-5) - ref::gelu(x[i] - 1e-5)) / 2e-5 * dy[i];
  EXPECT_LT(rel_err(dx, fd), 1e-8);
  auto xf = to_f32(x), dyf = to_f32(dy);
  std::vector<float> yf(n), dxf(n);
  gelu_forward(yf.data(), xf.data(), n);
  gelu_backward(dxf.data(), xf.data(), dyf.data(), n);
  EXPECT_LT(rel_err(yf, y), 2e-6);
  EXPECT_LT(rel_err(dxf, dx), 2e-6);
  std::vector<float> sum(n);
  add_forward(sum.data(), xf.data(), dyf.data(), n);
  EXPECT_EQ(sum[17], xf[17] + dyf[17]);
}

// The residual add fused with the LayerNorm after it: the same bits as add_forward then
// layernorm_forward (sum, output, mean, rstd), at 1 and 2 threads; within the f32
// tolerance of its reference twin (the sum, then the reference LayerNorm). Its gradient is
// the two ops' (checked against finite differences above and in LayerGrad.MlpAndBlock).
TEST(Kernels, AddLayerNormFusedEqualsTheTwoPasses) {
  const int saved = omp_get_max_threads();
  for (const auto& shape : std::vector<std::array<int64_t, 2>>{{1, 1}, {7, 33}, {129, 768}}) {
    const int64_t n = shape[0], c = shape[1];
    const auto x = randn(n * c, 11, 2.0), r = randn(n * c, 12), w = randn(c, 13), b = randn(c, 14);
    std::vector<double> sum(n * c), y(n * c), mean(n), rstd(n);
    for (int64_t i = 0; i < n * c; ++i) sum[i] = x[i] + r[i];
    ref::layernorm_forward(y.data(), mean.data(), rstd.data(), sum.data(), w.data(), b.data(), n, c);
    const auto xf = to_f32(x), rf = to_f32(r), wf = to_f32(w), bf = to_f32(b);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> fused = xf, fy(n * c), fm(n), fr(n);
      add_layernorm_forward(fused.data(), rf.data(), fy.data(), fm.data(), fr.data(), wf.data(), bf.data(), n, c);
      std::vector<float> apart(n * c), ay(n * c), am(n), ar(n);
      add_forward(apart.data(), xf.data(), rf.data(), n * c);
      layernorm_forward(ay.data(), am.data(), ar.data(), apart.data(), wf.data(), bf.data(), n, c);
      EXPECT_EQ(fused, apart) << n << " x " << c;
      EXPECT_EQ(fy, ay) << n << " x " << c;
      EXPECT_EQ(fm, am) << n << " x " << c;
      EXPECT_EQ(fr, ar) << n << " x " << c;
      EXPECT_LT(rel_err(fy, y), 2e-5) << n << " x " << c;
    }
  }
  omp_set_num_threads(saved);
}

TEST(Kernels, LayerNorm) {
  const int64_t n = 6, c = 33;
  auto x = randn(n * c, 7, 3.0), w = randn(c, 8), b = randn(c, 9), dy = randn(n * c, 10);
  std::vector<double> y(n * c), mean(n), rstd(n), dx(n * c), dw(c, 0), db(c, 0);
  ref::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  ref::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), n, c);
  auto fwd = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                 const std::vector<double>& bb) {
    std::vector<double> o(n * c), mm(n), rr(n);
    ref::layernorm_forward(o.data(), mm.data(), rr.data(), xx.data(), ww.data(), bb.data(), n, c);
    return o;
  };
  EXPECT_LT(rel_err(dx, numeric_grad(x, dy, [&](auto& v) { return fwd(v, w, b); })), 1e-6);
  EXPECT_LT(rel_err(dw, numeric_grad(w, dy, [&](auto& v) { return fwd(x, v, b); })), 1e-6);
  EXPECT_LT(rel_err(db, numeric_grad(b, dy, [&](auto& v) { return fwd(x, w, v); })), 1e-6);

  auto xf = to_f32(x), wf = to_f32(w), bf = to_f32(b), dyf = to_f32(dy);
  std::vector<float> yf(n * c), mf(n), rf(n), dxf(n * c), dwf(c, 0), dbf(c, 0);
  layernorm_forward(yf.data(), mf.data(), rf.data(), xf.data(), wf.data(), bf.data(), n, c);
  layernorm_backward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(),
                     mf.data(), rf.data(), n, c);
  EXPECT_LT(rel_err(yf, y), 2e-5);
  EXPECT_LT(rel_err(dxf, dx), 2e-5);
  EXPECT_LT(rel_err(dwf, dw), 2e-5);
  EXPECT_LT(rel_err(dbf, db), 2e-5);
}

// LayerNorm's weight and bias gradients: each column's chain over the rows in order, added to
// what the gradients held, whatever the thread count (each thread streams its columns' rows).
TEST(Kernels, LayerNormParameterGradientsSumEachColumnInRowOrder) {
  const int saved = omp_get_max_threads();
  for (auto [n, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 5}, {300, 133}, {2048, 97}}) {
    const auto x = to_f32(randn(n * c, 41)), dy = to_f32(randn(n * c, 42)), w = to_f32(randn(c, 43));
    const auto mean = to_f32(randn(n, 44)), start_w = to_f32(randn(c, 45)), start_b = to_f32(randn(c, 46));
    std::vector<float> rstd = to_f32(randn(n, 47));
    for (float& s : rstd) s = 1.0f + std::abs(s);
    std::vector<float> want_w = start_w, want_b = start_b;
    for (int64_t j = 0; j < c; ++j) {
      float dw = 0, db = 0;
      for (int64_t i = 0; i < n; ++i) {
        dw += dy[i * c + j] * (x[i * c + j] - mean[i]) * rstd[i];
        db += dy[i * c + j];
      }
      want_w[j] += dw;
      want_b[j] += db;
    }
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> dx(n * c), dw = start_w, db = start_b;
      layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), n, c);
      EXPECT_EQ(0, std::memcmp(dw.data(), want_w.data(), c * sizeof(float))) << n << " x " << c << ", " << threads;
      EXPECT_EQ(0, std::memcmp(db.data(), want_b.data(), c * sizeof(float))) << n << " x " << c << ", " << threads;
    }
  }
  omp_set_num_threads(saved);
}

// 9 rows of 17 logits with their targets, and the reference's losses and dlogits (mean).
struct CrossEntropyCase {
  static constexpr int64_t n = 9, v = 17;
  std::vector<double> logits = randn(n * v, 13, 3.0), loss = std::vector<double>(n), dl = std::vector<double>(n * v);
  std::vector<int32_t> tgt = std::vector<int32_t>(n);
  CrossEntropyCase() {
    for (int64_t i = 0; i < n; ++i) tgt[i] = static_cast<int32_t>((i * 5) % v);
    ref::cross_entropy_forward(loss.data(), logits.data(), tgt.data(), n, v);
    ref::cross_entropy_backward(dl.data(), logits.data(), tgt.data(), 1.0 / n, n, v);
  }
};

TEST(Kernels, CrossEntropy) {
  const CrossEntropyCase k;
  const int64_t n = k.n, v = k.v;
  // References, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const auto &logits = k.logits, &loss = k.loss, &dl = k.dl;
  const auto& tgt = k.tgt;
  std::vector<double> w(n, 1.0 / n);
  auto fwd = [&](const std::vector<double>& l) {
    std::vector<double> o(n);
    ref::cross_entropy_forward(o.data(), l.data(), tgt.data(), n, v);
    return o;
  };
  EXPECT_LT(rel_err(dl, numeric_grad(logits, w, fwd)), 1e-6);
  auto lf = to_f32(logits);
  std::vector<float> lossf(n), dlf(n * v);
  cross_entropy_forward(lossf.data(), lf.data(), tgt.data(), n, v);
  cross_entropy_backward(dlf.data(), lf.data(), tgt.data(), 1.0f / n, n, v);
  EXPECT_LT(rel_err(lossf, loss), 2e-6);
  EXPECT_LT(rel_err(dlf, dl), 2e-6);
  // In place (dlogits aliasing logits) gives the same.
  cross_entropy_backward(lf.data(), lf.data(), tgt.data(), 1.0f / n, n, v);
  EXPECT_EQ(lf, dlf);
}

// The rows' maxima the cross-entropy kernels shift by (row_max: 16 running maxima, then the tail) are
// max_element's, wherever the largest value sits: each position of rows of every width
// from 1 to 70 (both sides of the 16-lane blocks and their tails), all others below it.
TEST(Kernels, CrossEntropyRowMaxIsTheLargestWhereverItSits) {
  for (int64_t v = 1; v <= 70; ++v) {
    std::vector<float> rows(v * v), mx(v);
    for (int64_t i = 0; i < v; ++i)
      for (int64_t j = 0; j < v; ++j) rows[i * v + j] = j == i ? 3.5f : -1.0f - 0.01f * static_cast<float>((j * 7) % 13);
    cross_entropy_slice_max(mx.data(), rows.data(), v, v);
    for (int64_t i = 0; i < v; ++i) ASSERT_EQ(mx[i], 3.5f) << "width " << v << ", largest at " << i;
  }
}

// Vocab-parallel cross-entropy: three pieces of the columns (of unequal widths), combined as
// the layer combines them (max, then the sums), give the whole row's loss and dlogits; the
// fast slice kernels equal their reference twins.
TEST(Kernels, CrossEntropyBySlices) {
  const CrossEntropyCase k;
  const int64_t n = k.n, v = k.v;
  // References, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const auto &logits = k.logits, &loss = k.loss, &dl = k.dl;
  const auto& tgt = k.tgt;
  const int64_t begins[] = {0, 6, 12, 17};
  auto run = [&](auto slice_max, auto slice_sums, auto slice_backward, auto t) {
    using T = decltype(t);
    std::vector<std::vector<T>> pieces(3);
    for (int p = 0; p < 3; ++p)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = begins[p]; j < begins[p + 1]; ++j) pieces[p].push_back(static_cast<T>(logits[i * v + j]));
    std::vector<T> mx(n, -INFINITY), sums(2 * n, 0), piece_mx(n), piece_sums(2 * n);
    for (int p = 0; p < 3; ++p) {
      slice_max(piece_mx.data(), pieces[p].data(), n, begins[p + 1] - begins[p]);
      for (int64_t i = 0; i < n; ++i) mx[i] = std::max(mx[i], piece_mx[i]);
    }
    for (int p = 0; p < 3; ++p) {
      slice_sums(piece_sums.data(), pieces[p].data(), tgt.data(), mx.data(), n, begins[p + 1] - begins[p], begins[p]);
      for (int64_t i = 0; i < 2 * n; ++i) sums[i] += piece_sums[i];
    }
    std::vector<double> got_loss(n), got_dl(n * v);
    for (int64_t i = 0; i < n; ++i) got_loss[i] = std::log(sums[i]) + mx[i] - sums[n + i];
    for (int p = 0; p < 3; ++p) {
      const int64_t w = begins[p + 1] - begins[p];
      slice_backward(pieces[p].data(), pieces[p].data(), tgt.data(), mx.data(), sums.data(), static_cast<T>(1.0 / n), n,
                     w, begins[p]);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < w; ++j) got_dl[i * v + begins[p] + j] = pieces[p][i * w + j];
    }
    return std::pair{got_loss, got_dl};
  };
  auto [ref_loss, ref_dl] = run(ref::cross_entropy_slice_max<double>, ref::cross_entropy_slice_sums<double>,
                                ref::cross_entropy_slice_backward<double>, 0.0);
  EXPECT_LT(rel_err(ref_loss, loss), 1e-14);
  EXPECT_LT(rel_err(ref_dl, dl), 1e-14);
  auto [f64_loss, f64_dl] = run(cross_entropy_slice_max<double>, cross_entropy_slice_sums<double>,
                                cross_entropy_slice_backward<double>, 0.0);
  EXPECT_LT(rel_err(f64_loss, loss), 1e-14);
  EXPECT_LT(rel_err(f64_dl, dl), 1e-14);
  auto [f32_loss, f32_dl] = run(cross_entropy_slice_max<float>, cross_entropy_slice_sums<float>,
                                cross_entropy_slice_backward<float>, 0.0f);
  EXPECT_LT(rel_err(f32_loss, loss), 2e-6);
  EXPECT_LT(rel_err(f32_dl, dl), 2e-6);
}

TEST(Kernels, Embedding) {
  // Repeated ids: backward must accumulate; -1: a row another vocab-parallel piece holds.
  const int64_t n = 12, c = 70, vocab = 4;
  auto table = randn(vocab * c, 14), dy = randn(n * c, 15);
  std::vector<int32_t> ids = {0, 3, 3, -1, 1, 0, 2, 3, 1, -1, 1, 0};
  std::vector<double> y(n * c), dt(vocab * c, 0);
  ref::embedding_forward(y.data(), ids.data(), table.data(), n, c);
  ref::embedding_backward(dt.data(), ids.data(), dy.data(), n, c);
  for (int64_t j = 0; j < c; ++j) EXPECT_EQ(y[3 * c + j], 0.0);
  auto fwd = [&](const std::vector<double>& tb) {
    std::vector<double> o(n * c);
    ref::embedding_forward(o.data(), ids.data(), tb.data(), n, c);
    return o;
  };
  EXPECT_LT(rel_err(dt, numeric_grad(table, dy, fwd)), 1e-6);
  // Same order of additions on any thread count (strips of channels narrow to 16 for more
  // threads): bitwise equal.
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 16}) {
    omp_set_num_threads(threads);
    std::vector<double> y2(n * c), dt2(vocab * c, 0);
    embedding_forward(y2.data(), ids.data(), table.data(), n, c);
    embedding_backward(dt2.data(), ids.data(), dy.data(), n, c);
    EXPECT_EQ(y2, y) << threads;
    EXPECT_EQ(dt2, dt) << threads;
  }
  omp_set_num_threads(saved);
}

TEST(Kernels, AdamWAndSgdMatchReference) {
  const int64_t n = 257;
  auto p = randn(n, 16), g = randn(n, 17), m0 = randn(n, 18, 0.1), v0 = randn(n, 19, 0.1);
  for (auto& x : v0) x = x * x;
  AdamWStep s{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
  auto pr = p, mr = m0, vr = v0;
  ref::adamw_update(pr.data(), g.data(), mr.data(), vr.data(), n, s);
  auto pf = p, mf = m0, vf = v0;
  adamw_update(pf.data(), g.data(), mf.data(), vf.data(), n, s);
  EXPECT_LT(rel_err(pf, pr), 1e-14);
  EXPECT_LT(rel_err(mf, mr), 1e-14);
  EXPECT_LT(rel_err(vf, vr), 1e-14);
  // A hand-computed first step: m = 0.1 g, v = 0.05 g^2, update = lr * sign(g) (eps aside).
  std::vector<double> p1 = {1.0}, g1 = {2.0}, m1 = {0.0}, v1 = {0.0};
  AdamWStep s1{.lr = 0.5, .beta1 = 0.9, .beta2 = 0.95, .eps = 0.0, .weight_decay = 0.2, .step = 1};
  adamw_update(p1.data(), g1.data(), m1.data(), v1.data(), 1, s1);
  EXPECT_DOUBLE_EQ(p1[0], 1.0 * (1 - 0.5 * 0.2) - 0.5);

  auto ps = p, bs = m0, pq = p, bq = m0;
  for (int step = 0; step < 3; ++step) {
    ref::sgd_update(ps.data(), g.data(), bs.data(), n, 0.1, 0.9, 0.01, step == 0);
    sgd_update(pq.data(), g.data(), bq.data(), n, 0.1, 0.9, 0.01, step == 0);
  }
  EXPECT_LT(rel_err(pq, ps), 1e-14);
}

}  // namespace
}  // namespace loom::kernels

namespace loom::kernels {
namespace {

// fast_exp within 1.5 ulp of libm over the whole clamped range; fast_tanh within 2e-7
// absolute (GELU consumes 1 + tanh, so absolute error is what matters).
TEST(FastMath, ExpAndTanhAccuracy) {
  double worst_exp = 0, worst_tanh = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    double want = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(fast_exp(x) - want) / want);
    worst_tanh = std::max(worst_tanh, std::fabs(fast_tanh(x * 0.1f) - std::tanh(static_cast<double>(x * 0.1f))));
  }
  EXPECT_LT(worst_exp, 1.8e-7);  // 1.5 ulp of float is 1.8e-7 relative at worst
  EXPECT_LT(worst_tanh, 2e-7);
  EXPECT_EQ(fast_exp(-1000.0f), fast_exp(-87.0f));
  EXPECT_GT(fast_exp(1000.0f), 1e38f);
  EXPECT_EQ(fast_tanh(100.0f), 1.0f);
  EXPECT_EQ(fast_tanh(-100.0f), -1.0f);
}

// Small work runs on the caller's thread, large work on the pool (with 2 threads), and
// inside a region always on the caller's: every index exactly once either way, and every
// chunk of parallel_chunks covers its share with the last one cut at n.
TEST(Kernels, ParallelForRunsEveryIndexOnceOnTheRightThreads) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  auto run = [](int64_t n, int64_t elements) {
    std::vector<int> hits(static_cast<size_t>(n)), team(static_cast<size_t>(n));
    parallel_for(n, elements, [&](int64_t i) { ++hits[i], team[i] = omp_get_num_threads(); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << i;
    return *std::max_element(team.begin(), team.end());
  };
  EXPECT_EQ(run(16, 16 * 256), 1);
  EXPECT_EQ(run(2048, 2048 * 256), 2);
#pragma omp parallel num_threads(1)
  EXPECT_EQ(run(2048, 2048 * 256), 1);  // a team of one is a region: no nested team
  std::vector<int> covered(10001);
  parallel_chunks(10001, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) ++covered[i];
  }, 4096);
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), 10001);
  omp_set_num_threads(threads);
}

// fixed_sum's order is the code's: element j into partial sum j % 16, then the partials
// pairwise. A plain scalar loop in that order gives the same bits (values spanning 12
// orders of magnitude, so any other order would differ), whatever the build vectorizes.
TEST(Kernels, FixedSumAddsInItsStatedOrder) {
  Rng rng(5);
  for (int64_t n : {0, 1, 15, 16, 17, 64, 100, 1000, 4097}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform() * 12 - 6));
    float lanes[16] = {};
    for (int64_t j = 0; j < n; ++j) lanes[j % 16] += x[j];
    for (int w = 8; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
    const float got = fixed_sum<float>(n, [&](int64_t j) { return x[j]; });
    EXPECT_EQ(std::memcmp(&got, &lanes[0], sizeof got), 0) << "n " << n << ": " << got << " vs " << lanes[0];
    float a = 0, b = 0;
    fixed_sum2(n, a, b, [&](int64_t j, float& s, float& t) { s += x[j], t += 2 * x[j]; });
    EXPECT_EQ(std::memcmp(&a, &got, sizeof a), 0) << n;
    EXPECT_EQ(b, 2 * got) << n;  // doubling is exact, so the second sum is twice the first
  }
}

}  // namespace
}  // namespace loom::kernels
