// Loom's GEMM on parts of a packed op(B) (PackedB, the attention's per-head operands), from
// 16-bit bits, and over several row tiles: the bits of the plain products, on every path
// this CPU supports and on any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemm/amx.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_testing.h"
#include "kernels/precision.h"
#include "kernels/reference/reference.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

// Products reading parts of a packed op(B) (PackedB: the attention's per-head operands) give
// the bits of gemm_as on those parts of the matrix: every path, f32, bf16 and f16 operands
// and f64, op(B) transposed or not, op(A) too, parts at a column and k offset, deeper than
// one packed block, with an odd k at the matrix's end (the pad of the last pair), a few rows
// (where gemm does not pack) and many; and under OpenBLAS, which reads the matrix in place.
template <typename T>
void expect_packed_parts_equal_gemm(DType operands, const std::string& what) {
  const int64_t kk = 1101, nn = 200, pad = 3;  // op(B) (kk, nn): k past bf16's 1024-deep block
  const struct {
    int64_t p0, k, j0, n;
  } parts[] = {{0, kk, 0, nn}, {64, kk - 64, 32, nn - 32}, {2, 100, 96, 33}, {1036, 65, 160, 40}, {0, 0, 0, 7}};
  uint64_t seed = 77;
  for (bool tb : {false, true}) {
    const std::vector<T> b = random_matrix<T>((tb ? nn : kk) * (tb ? kk + pad : nn + pad), seed++);
    const int64_t ldb = tb ? kk + pad : nn + pad;
    PackedB<T> packed;
    packed.pack(operands, tb, kk, nn, b.data(), ldb);
    for (const auto& part : parts)
      for (int64_t m : {int64_t{5}, int64_t{97}})
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, accumulate = t & 2;
          const int64_t lda = (ta ? m : part.k) + pad, ldc = part.n + pad;
          const std::vector<T> a = random_matrix<T>((ta ? part.k : m) * lda + 1, seed++);
          std::vector<T> want = random_matrix<T>(m * ldc, seed++), got = want;
          const T* b_part = tb ? b.data() + part.j0 * ldb + part.p0 : b.data() + part.p0 * ldb + part.j0;
          gemm_as<T>(operands, ta, tb, m, part.n, part.k, a.data(), lda, b_part, ldb, accumulate, want.data(), ldc);
          gemm_packed_b<T>(ta, m, part.n, part.k, a.data(), lda, packed, part.p0, part.j0, accumulate, got.data(),
                           ldc);
          EXPECT_TRUE(same_bits(got, want)) << what << " trans_b=" << tb << " trans_a=" << ta << " m=" << m
                                            << " part p0=" << part.p0 << " k=" << part.k << " j0=" << part.j0
                                            << " n=" << part.n << " accumulate=" << accumulate;
        }
  }
}

TEST(Gemm, ProductsOnPackedPartsEqualGemmOnThoseParts) {
  for (GemmPath path : paths_and_amx()) {
    set_gemm_path(path);
    for (DType operands : {DType::kF32, DType::kBF16, DType::kF16})
      expect_packed_parts_equal_gemm<float>(operands, cat(gemm_path_name(path), " ", dtype_name(operands)));
  }
  // On one thread every f32 product reads op(A) in place, unpacked, where the path's kernel
  // can (MicroKernel::direct); above, the larger ones ran packed on the pool.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (GemmPath path : paths_and_amx()) {
    set_gemm_path(path);
    expect_packed_parts_equal_gemm<float>(DType::kF32, cat(gemm_path_name(path), " f32, 1 thread"));
  }
  omp_set_num_threads(threads);
  set_gemm_path(GemmPath::kAuto);
  expect_packed_parts_equal_gemm<double>(DType::kF32, "f64");
  set_gemm_backend(GemmBackend::kOpenBlas);
  expect_packed_parts_equal_gemm<float>(DType::kBF16, "openblas bf16");
  set_gemm_backend(GemmBackend::kLoom);
}

// op(B) packed from 16-bit bits (PackedB::pack on bits), and products whose op(A) is bits too
// (gemm_packed_b on bits), give the bits of packing and multiplying their f32 values: bf16 (with
// subnormals and NaNs among the bits) and f16, every path, each operand transposed or not,
// parts at offsets and past one packed block, a few rows and many.
TEST(GemmHalf, PackedPartsFromBitsEqualThoseFromTheirValues) {
  const int64_t kk = 1101, nn = 200, pad = 3;
  const struct {
    int64_t p0, k, j0, n;
  } parts[] = {{0, kk, 0, nn}, {64, kk - 64, 32, nn - 32}, {1036, 65, 160, 40}};
  for (GemmPath path : paths_and_amx())
    for (DType format : {DType::kBF16, DType::kF16}) {
      set_gemm_path(path);
      uint64_t seed = 800;
      for (bool tb : {false, true}) {
        const int64_t ldb = tb ? kk + pad : nn + pad;
        const StoredOperand b(format, random_matrix<float>((tb ? nn : kk) * ldb, seed++), true, 0);
        PackedB<float> from_values, from_bits;
        from_values.pack(format, tb, kk, nn, b.values.data(), ldb);
        from_bits.pack(format, tb, kk, nn, b.bits.data(), ldb);
        for (const auto& part : parts)
          for (int64_t m : {int64_t{5}, int64_t{97}})
            for (bool ta : {false, true}) {
              const int64_t lda = (ta ? m : part.k) + pad, ldc = part.n + pad;
              const StoredOperand a(format, random_matrix<float>((ta ? part.k : m) * lda, seed++), false, 1);
              std::vector<float> want(m * ldc), got_b(m * ldc), got_ab(m * ldc);
              gemm_packed_b<float>(ta, m, part.n, part.k, a.values.data(), lda, from_values, part.p0, part.j0, false,
                                   want.data(), ldc);
              gemm_packed_b<float>(ta, m, part.n, part.k, a.values.data(), lda, from_bits, part.p0, part.j0, false,
                                   got_b.data(), ldc);
              gemm_packed_b(ta, m, part.n, part.k, a.bits.data(), lda, from_bits, part.p0, part.j0, false,
                                 got_ab.data(), ldc);
              const std::string what = cat(gemm_path_name(path), " ", dtype_name(format), " trans_a=", ta,
                                           " trans_b=", tb, " m=", m, " p0=", part.p0, " j0=", part.j0);
              EXPECT_TRUE(same_bits_or_nan(got_b, want)) << what << " (op(B) from bits)";
              EXPECT_TRUE(same_bits_or_nan(got_ab, want)) << what << " (both from bits)";
            }
      }
    }
  set_gemm_path(GemmPath::kAuto);
}

// Products of several row tiles (each packing op(B) for itself) give the reference's bits:
// every path, f32 and bf16 (op(B) from f32 values and from its bits; AMX's order through its
// kernel's twin), op(B) transposed or not, k past one packed block and odd, 1 to 3 threads.
TEST(Gemm, ProductsOfSeveralRowTilesEqualTheReference) {
  const int saved = omp_get_max_threads();
  uint64_t seed = 4000;
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1100, 70, 1029}, {2100, 300, 40}})
    for (bool tb : {false, true}) {
      const Problem<float> p(false, tb, m, n, k, 3, seed += 3);
      const StoredOperand a(DType::kBF16, p.a, false, 0), b(DType::kBF16, p.b, false, 0);
      Problem<float> stored = p;  // the operands' bits as values
      stored.a = a.values;
      stored.b = b.values;
      const std::vector<float> want = p.reference(true), want_half = reference_half(DType::kBF16, p, false),
                               want_bits = reference_half(DType::kBF16, stored, false);
      std::vector<float> want_amx = p.c0;  // AMX's own order, through its kernel's plain twin
      reference::gemm_half_amx(false, tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, false, want_amx.data(), p.ldc);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        const std::string where = cat("threads=", threads, " m=", m, " n=", n, " k=", k, " trans_b=", tb);
        for (GemmPath path : gemm_supported_paths()) {
          set_gemm_path(path);
          EXPECT_TRUE(same_bits(p.run(path, true), want)) << gemm_path_name(path) << " " << where;
          EXPECT_TRUE(same_bits(run_half(path, DType::kBF16, p, false), want_half))
              << gemm_path_name(path) << " " << where;
          std::vector<float> c = p.c0;
          gemm_half_bits(DType::kBF16, false, tb, m, n, k, a.bits.data(), p.lda, b.bits.data(), p.ldb, false, c.data(),
                         p.ldc);
          EXPECT_TRUE(same_bits(c, want_bits)) << gemm_path_name(path) << " " << where << " (bits)";
        }
        std::vector<float> c = p.c0;
        gemm_detail::gemm_half_amx_twin(false, tb, m, n, k, p.a.data(), p.lda, p.b.data(), p.ldb, false, c.data(),
                                        p.ldc);
        EXPECT_TRUE(same_bits(c, want_amx)) << "amx (twin) " << where;
      }
    }
  set_gemm_path(GemmPath::kAuto);
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace loom::kernels
