// Helpers of the GEMM tests (gemm_test.cc, gemm_parts_test.cc): random strided problems
// and their reference products, bit comparisons, 16-bit operands held as bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "kernels/precision.h"
#include "kernels/reference/reference.h"
#include "loom/core/rng.h"

namespace loom::kernels {

template <typename T>
std::vector<T> random_matrix(int64_t count, uint64_t seed) {
  Rng r(seed);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(r.normal());
  return v;
}

// One product's operands, with leading dimensions padded past the row length (strided).
template <typename T>
struct Problem {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  std::vector<T> a, b, c0;

  Problem(bool ta_, bool tb_, int64_t m_, int64_t n_, int64_t k_, int64_t pad, uint64_t seed)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_) {
    lda = (ta ? m : k) + pad;
    ldb = (tb ? k : n) + pad;
    ldc = n + pad;
    a = random_matrix<T>((ta ? k : m) * lda + 1, seed);
    b = random_matrix<T>((tb ? n : k) * ldb + 1, seed + 1);
    c0 = random_matrix<T>(m * ldc + 1, seed + 2);
  }
  std::vector<T> reference(bool accumulate) const {
    std::vector<T> c = c0;
    reference::gemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, accumulate, c.data(), ldc);
    return c;
  }
  std::vector<T> run(GemmPath path, bool accumulate) const {
    std::vector<T> c = c0;
    if constexpr (std::is_same_v<T, float>)
      gemm_f32(path, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, accumulate, c.data(), ldc);
    else
      gemm<T>(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, accumulate, c.data(), ldc);
    return c;
  }
};

template <typename T>
bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}
// The same, but a NaN only has to be a NaN (payloads are not part of the contract).
inline bool same_bits_or_nan(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isnan(x[i]) ? !std::isnan(y[i]) : std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return false;
  return true;
}

// The paths this CPU has, AMX's too where present: for the tests that compare a path with
// itself (AMX's bf16 products have bits of their own, reference::gemm_half_amx's).
inline std::vector<GemmPath> paths_and_amx() {
  std::vector<GemmPath> paths = gemm_supported_paths();
  if (gemm_path_supported(GemmPath::kAmx)) paths.insert(paths.begin(), GemmPath::kAmx);
  return paths;
}

// (m, n, k): ones, primes, tile edges plus and minus one, and k past two packed blocks.
inline const std::vector<std::tuple<int64_t, int64_t, int64_t>> kShapes = {
    {1, 1, 1},     {1, 37, 5},  {29, 1, 7}, {7, 13, 1},    {12, 32, 256}, {13, 33, 257},
    {11, 31, 255}, {6, 16, 64}, {5, 17, 3}, {97, 131, 67}, {64, 96, 600}, {200, 70, 513},
    // a few rows (skinny.h: no packing), past one block of accumulators
    {2, 300, 70},  {3, 1, 9},   {4, 513, 257}, {8, 128, 40}, {6, 256, 33},
    {12, 64, 50},  {16, 96, 33}, {9, 32, 7},  {16, 40, 20}, {25, 288, 31}, {32, 64, 17}, {17, 33, 9}};

// A 16-bit product of p on a path, and its reference twin's (reference::gemm_half).
inline std::vector<float> run_half(GemmPath path, DType format, const Problem<float>& p, bool accumulate) {
  std::vector<float> c = p.c0;
  gemm_half_on(path, format, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, c.data(),
               p.ldc);
  return c;
}
inline std::vector<float> reference_half(DType format, const Problem<float>& p, bool accumulate) {
  std::vector<float> c = p.c0;
  reference::gemm_half(format, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, accumulate, c.data(),
                       p.ldc);
  return c;
}

// An operand held as 16-bit bits, with its bf16 subnormals (read as zero, as the f32
// packing reads them) and, with `nans`, signalling NaNs (which the packing makes quiet):
// the bits and their f32 values.
struct StoredOperand {
  std::vector<uint16_t> bits;
  std::vector<float> values;
  StoredOperand(DType format, const std::vector<float>& x, bool nans, size_t offset) : bits(x.size()), values(x.size()) {
    store_half(format, bits.data(), x.data(), static_cast<int64_t>(x.size()));
    if (format == DType::kBF16)  // some subnormals: exponent bits zero
      for (size_t i = offset; i < bits.size(); i += 11) bits[i] = static_cast<uint16_t>((bits[i] & 0x807f) | 1);
    if (format == DType::kBF16 && nans)
      for (size_t i = 5 + offset; i < bits.size(); i += 997) bits[i] = static_cast<uint16_t>(i % 2 ? 0x7f81 : 0xff81);
    load_half(format, values.data(), bits.data(), static_cast<int64_t>(bits.size()));
  }
};

}  // namespace loom::kernels
