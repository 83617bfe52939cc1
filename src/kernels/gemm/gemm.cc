// Loom's GEMM: micro-kernel and path dispatch over the tile driver (tiles.h); and the
// OpenBLAS backend kept for comparison. See gemm.h for the contract and the order of
// arithmetic, microkernel.h for the micro-kernel contract.
#include "kernels/gemm/gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/openblas.h"
#include "kernels/gemm/amx.h"
#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/packing.h"
#include "kernels/gemm/skinny.h"
#include "kernels/gemm/tiles.h"
#include "kernels/precision.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

using gemm_detail::kParallelMinWork;
using gemm_detail::MicroKernel;

const MicroKernel<float> kGenericF32 = {"generic", 4, 16, 256, 240, 256, 240,
                                        gemm_detail::microkernel_generic<float, 4, 16>,
                                        gemm_detail::fma_loop_generic, nullptr, nullptr};
const MicroKernel<double> kGenericF64 = {"generic", 4, 8, 256, 240, 256, 240,
                                         gemm_detail::microkernel_generic<double, 4, 8>,
                                         gemm_detail::fma_loop_generic, nullptr, nullptr};

std::atomic<GemmPath> g_path{GemmPath::kAuto};
std::atomic<GemmBackend> g_backend{GemmBackend::kLoom};
std::atomic<GemmSharedPack> g_shared_pack{GemmSharedPack::kAuto};

// kAuto's threshold: at 2 threads a shared operand measured no faster (gpt-mini's products on
// Zen 4: each core's private pack lands in its own L2), while each of n threads packing all
// of it does n times the packing (docs/numerics.md: an estimated third of a gpt-mini weight
// gradient's time at 16).
constexpr int kSharedPackThreads = 4;

}  // namespace

bool gemm_detail::shares_packing(int threads) {
  const GemmSharedPack mode = g_shared_pack.load();
  if (threads < 2 || mode == GemmSharedPack::kOff) return false;
  return mode == GemmSharedPack::kOn || threads >= kSharedPackThreads;
}

namespace {

using gemm_detail::AmxPacking;
using gemm_detail::AsBf16;
using gemm_detail::AsF16;
using gemm_detail::AsIs;
using gemm_detail::ceil_div;
using gemm_detail::FlushSubnormals;
using gemm_detail::Operand;
using gemm_detail::PairPacking;
using gemm_detail::PlainPacking;
using gemm_detail::Prepacked;
using gemm_detail::gemm_packed;
using gemm_detail::product_threads;
using gemm_detail::round_up;
using gemm_detail::start_whole;
using gemm_detail::trivial_product;


// An f32 or f64 product on a plain kernel: a few rows without packing (skinny.h), else packed.
template <typename T>
void gemm_loom(const MicroKernel<T>& mk,
               bool trans_a,
               bool trans_b,
               int64_t m,
               int64_t n,
               int64_t k,
               const T* a,
               int64_t lda,
               const T* b,
               int64_t ldb,
               bool accumulate,
               T* c,
               int64_t ldc,
               const GemmEpilogue<T>& epilogue,
               const GemmPrologue<T>& prologue = {}) {
  if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
  const int threads = product_threads(m, n, k);
  if (m <= gemm_detail::kSkinnyRows && !trans_a) {  // a few rows: no packing (skinny.h)
    start_whole(prologue, m, n, c, ldc, accumulate);
    const int64_t chunk = round_up(ceil_div(n, threads), 16);
    const auto block = [&](int64_t j0) {
      const int64_t cols = std::min(chunk, n - j0);
      gemm_detail::skinny_block(m, k, a, lda, b, ldb, trans_b, accumulate, c, ldc, j0, cols);
      if (epilogue) epilogue.fn(0, m, j0, cols, c + j0, ldc);
    };
    if (threads == 1) {
      for (int64_t j0 = 0; j0 < n; j0 += chunk) block(j0);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t j0 = 0; j0 < n; j0 += chunk) block(j0);
    return;
  }
  gemm_packed(mk, PlainPacking<AsIs, T>{}, threads, Operand<T>{a, lda, trans_a}, Operand<T>{b, ldb, trans_b}, m, n, k,
              accumulate, c, ldc, epilogue, prologue);
}

// The f32 kernel of a path (AVX512_BF16's f32 products are AVX-512F's).
const MicroKernel<float>& kernel_for(GemmPath path) {
  switch (path == GemmPath::kAuto ? gemm_best_path() : path) {
    case GemmPath::kAmx:
    case GemmPath::kAvx512Bf16:
    case GemmPath::kAvx512:
      return gemm_detail::kAvx512Kernel;
    case GemmPath::kAvx2:
      return gemm_detail::kAvx2Kernel;
    default:
      return kGenericF32;
  }
}

}  // namespace

void set_gemm_path(GemmPath path) {
  if (!gemm_path_supported(path))
    throw InputError(cat("gemm path '", gemm_path_name(path), "' needs ",
                         path == GemmPath::kAmx        ? "AMX-TILE and AMX-BF16 (and the OS's leave to use them)"
                         : path == GemmPath::kAvx512Bf16 ? "AVX512_BF16"
                         : path == GemmPath::kAvx512   ? "AVX-512F"
                                                       : "AVX2 and FMA",
                         ", which this CPU does not report"));
  g_path = path;
}
GemmPath gemm_active_path() { return g_path == GemmPath::kAuto ? gemm_best_path() : g_path.load(); }
void set_gemm_backend(GemmBackend backend) { g_backend = backend; }
void set_gemm_shared_pack(GemmSharedPack mode) { g_shared_pack = mode; }
GemmSharedPack gemm_shared_pack() { return g_shared_pack; }
GemmBackend gemm_active_backend() { return g_backend; }

void gemm_f32(GemmPath path,
              bool trans_a,
              bool trans_b,
              int64_t m,
              int64_t n,
              int64_t k,
              const float* a,
              int64_t lda,
              const float* b,
              int64_t ldb,
              bool accumulate,
              float* c,
              int64_t ldc) {
  LOOM_CHECK(gemm_path_supported(path));
  gemm_loom(kernel_for(path), trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, {});
}

namespace {

const MicroKernel<float> kGenericBf16 = {"generic", 4, 16, 256, 240, 256, 240,
                                         gemm_detail::microkernel_generic_ftz<4, 16>,
                                         gemm_detail::fma_loop_generic, nullptr, nullptr};

// Calls f(kernel, packing) with the micro-kernel and the packing a product of T `operands`
// runs on the path (kAuto resolved as gemm() and gemm_half() resolve it): one place decides.
template <typename T, typename F>
void on_kernel(DType operands, GemmPath path, F&& f) {
  if constexpr (std::is_same_v<T, double>) {
    LOOM_CHECK(operands == DType::kF32);
    f(kGenericF64, PlainPacking<AsIs, double>{});
  } else if (operands == DType::kF32) {
    f(kernel_for(path), PlainPacking<AsIs, float>{});
  } else {
    LOOM_CHECK(operands == DType::kBF16 || operands == DType::kF16);
    if (path == GemmPath::kAuto) path = gemm_best_half_path();
    if (operands == DType::kF16) {  // f16 values are exact in f32: the f32 kernels, no flushing
      f(kernel_for(path), PlainPacking<AsF16, float>{});
    } else if (path == GemmPath::kAmx) {
      f(gemm_detail::kAmxKernel, AmxPacking{});
    } else if (path == GemmPath::kAvx512Bf16) {
      f(gemm_detail::kAvx512Bf16Kernel, PairPacking{});
    } else if (path == GemmPath::kGeneric) {
      f(kGenericBf16, PlainPacking<AsBf16, float>{});
    } else {
      f(kernel_for(path), PlainPacking<AsBf16, float>{true});
    }
  }
}

// A 16-bit product on a path (microkernel.h, docs/numerics.md "16-bit products").
void gemm_half_loom(GemmPath path,
                    DType format,
                    bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    const float* a,
                    int64_t lda,
                    const float* b,
                    int64_t ldb,
                    bool accumulate,
                    float* c,
                    int64_t ldc,
                    const GemmEpilogue<float>& epilogue,
                    const GemmPrologue<float>& prologue = {}) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  LOOM_CHECK(gemm_path_supported(path));
  if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
  const int threads = product_threads(m, n, k);
  on_kernel<float>(format, path, [&](const auto& mk, const auto& packing) {
    gemm_packed(mk, packing, threads, Operand<float>{a, lda, trans_a}, Operand<float>{b, ldb, trans_b}, m, n, k,
                accumulate, c, ldc, epilogue, prologue);
  });
}

// Rounded copies of op(A) and op(B)'s matrices for OpenBLAS, which has no 16-bit products
// here: its sgemm on the values a 16-bit product multiplies.
std::vector<float> rounded(DType format, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * ld));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * ld + j] = format == DType::kBF16 ? bf16_operand(x[i * ld + j]) : f16_operand(x[i * ld + j]);
  return out;
}

}  // namespace

void gemm_half(DType format,
               bool trans_a,
               bool trans_b,
               int64_t m,
               int64_t n,
               int64_t k,
               const float* a,
               int64_t lda,
               const float* b,
               int64_t ldb,
               bool accumulate,
               float* c,
               int64_t ldc,
               const GemmEpilogue<float>& epilogue,
               const GemmPrologue<float>& prologue) {
  if (g_backend == GemmBackend::kOpenBlas) {
    if (m == 0 || n == 0) return;
    const std::vector<float> ra = rounded(format, a, trans_a ? k : m, trans_a ? m : k, lda);
    const std::vector<float> rb = rounded(format, b, trans_b ? n : k, trans_b ? k : n, ldb);
    gemm<float>(trans_a, trans_b, m, n, k, ra.data(), lda, rb.data(), ldb, accumulate, c, ldc, epilogue, prologue);
    return;
  }
  gemm_half_loom(g_path, format, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
}

void gemm_half_on(GemmPath path,
                  DType format,
                  bool trans_a,
                  bool trans_b,
                  int64_t m,
                  int64_t n,
                  int64_t k,
                  const float* a,
                  int64_t lda,
                  const float* b,
                  int64_t ldb,
                  bool accumulate,
                  float* c,
                  int64_t ldc) {
  gemm_half_loom(path, format, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, {});
}

namespace {

// An operand for gemm_half: f32 values as they are; 16-bit bits as their f32 values (exact),
// in `buffer`, kept per thread by the caller: a fresh one each product (megabytes) would
// fault its pages in every step.
const float* f32_values(DType, const float* x, int64_t, int64_t, int64_t, std::vector<float>&) { return x; }
const float* f32_values(DType format, const uint16_t* x, int64_t rows, int64_t cols, int64_t ld,
                        std::vector<float>& buffer) {
  buffer.resize(static_cast<size_t>(rows * ld));
  if (ld == cols) {
    load_half(format, buffer.data(), x, rows * cols);
  } else {
    for (int64_t i = 0; i < rows; ++i) load_half(format, buffer.data() + i * ld, x + i * ld, cols);
  }
  return buffer.data();
}

}  // namespace

// Loom's packers read the bits themselves (into pairs for vdpbf16ps, into the values a
// 16-bit product multiplies for the f32 kernels); OpenBLAS's products get their f32 values
// first, which gemm_half reads: the same bits. (Widening the bits into an f32 copy of each
// operand first was 1.7% of a bf16 gpt-mini step on Zen 3, and rounding those exact values
// again as they were packed cost what flushing and quieting the bits now costs, and more.)
template <typename ValueB>
void gemm_half_bits(DType format,
                    bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    const uint16_t* a,
                    int64_t lda,
                    const ValueB* b,
                    int64_t ldb,
                    bool accumulate,
                    float* c,
                    int64_t ldc,
                    const GemmEpilogue<float>& epilogue,
                    const GemmPrologue<float>& prologue) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  const GemmPath path = g_path == GemmPath::kAuto ? gemm_best_half_path() : g_path.load();
  if (g_backend == GemmBackend::kLoom) {
    LOOM_CHECK(gemm_path_supported(path));
    if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
    const int threads = product_threads(m, n, k);
    on_kernel<float>(format, path, [&](const auto& mk, const auto& packing) {
      // (on_kernel's f32 packing is never picked for a 16-bit format; it has no bits to read)
      if constexpr (!std::is_same_v<std::decay_t<decltype(packing)>, PlainPacking<AsIs, float>>)
        gemm_packed(mk, packing, threads, Operand<uint16_t>{a, lda, trans_a}, Operand<ValueB>{b, ldb, trans_b}, m,
                    n, k, accumulate, c, ldc, epilogue, prologue);
    });
    return;
  }
  thread_local std::vector<float> a_values, b_values;
  gemm_half(format, trans_a, trans_b, m, n, k,
            f32_values(format, a, trans_a ? k : m, trans_a ? m : k, lda, a_values), lda,
            f32_values(format, b, trans_b ? n : k, trans_b ? k : n, ldb, b_values), ldb, accumulate, c, ldc,
            epilogue, prologue);
}

template void gemm_half_bits<float>(DType, bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                                    const float*, int64_t, bool, float*, int64_t, const GemmEpilogue<float>&,
                                    const GemmPrologue<float>&);
template void gemm_half_bits<uint16_t>(DType, bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                                       const uint16_t*, int64_t, bool, float*, int64_t, const GemmEpilogue<float>&,
                                       const GemmPrologue<float>&);

template <typename T>
void PackedB<T>::pack(DType operands, bool trans_b, int64_t k, int64_t n, const T* b, int64_t ldb) {
  pack_operand(operands, trans_b, k, n, b, ldb);
  b_ = b;
}

template <typename T>
void PackedB<T>::pack(DType format, bool trans_b, int64_t k, int64_t n, const uint16_t* b, int64_t ldb)
  requires std::is_same_v<T, float>
{
  LOOM_CHECK((format == DType::kBF16 || format == DType::kF16) && g_backend == GemmBackend::kLoom);
  pack_operand(format, trans_b, k, n, b, ldb);
  b_ = nullptr;
}

template <typename T>
template <typename V>
void PackedB<T>::pack_operand(DType operands, bool trans_b, int64_t k, int64_t n, const V* b, int64_t ldb) {
  LOOM_CHECK(k >= 0 && n >= 0);
  operands_ = operands;
  trans_ = trans_b;
  ldb_ = ldb;
  k_ = k;
  n_ = n;
  blas_ = g_backend == GemmBackend::kOpenBlas;
  path_ = g_path.load();  // products run on the kernel this picks (on_kernel), kAuto included
  if (blas_) return;
  LOOM_CHECK(gemm_path_supported(path_));
  on_kernel<T>(operands, path_, [&](const auto& mk, const auto& packing) {
    using Packing = std::decay_t<decltype(packing)>;
    using P = typename Packing::P;
    // (bits are packed for 16-bit operands only, never by the f32 or f64 packing, which has
    // none to read: Clang instantiates the bits' pack for PackedB<double> too)
    if constexpr (std::is_same_v<V, T> ||
                  (std::is_same_v<T, float> && !std::is_same_v<Packing, PlainPacking<AsIs, float>>)) {
      stride_ = ceil_div(k, Packing::kStep) * mk.nr;
      const int64_t bytes = std::max<int64_t>(1, ceil_div(n, mk.nr) * stride_) * int64_t{sizeof(P)};
      if (capacity_ < bytes) {
        data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(round_up(bytes, 64)))));
        LOOM_CHECK(data_ != nullptr);
        capacity_ = bytes;
      }
      if (k > 0 && n > 0) packing.b(Operand<V>{b, ldb, trans_b}, 0, k, 0, n, mk.nr, reinterpret_cast<P*>(data_.get()));
    }
  });
}

template <typename T>
void gemm_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const PackedB<T>& b,
                   int64_t p0, int64_t j0, bool accumulate, T* c, int64_t ldc) {
  LOOM_CHECK(j0 % 32 == 0 && p0 % 2 == 0 && (k % 2 == 0 || p0 + k == b.k_));
  LOOM_CHECK(p0 >= 0 && j0 >= 0 && p0 + k <= b.k_ && j0 + n <= b.n_);
  if (b.blas_) {
    const T* part = b.trans_ ? b.b_ + j0 * b.ldb_ + p0 : b.b_ + p0 * b.ldb_ + j0;
    return gemm_as<T>(b.operands_, trans_a, b.trans_, m, n, k, a, lda, part, b.ldb_, accumulate, c, ldc);
  }
  if (trivial_product(m, n, k, accumulate, c, ldc, {}, {})) return;
  on_kernel<T>(b.operands_, b.path_, [&](const auto& mk, const auto& packing) {
    using Packing = std::decay_t<decltype(packing)>;
    using P = typename Packing::P;
    const P* data = reinterpret_cast<const P*>(b.data_.get());
    const Prepacked<P> part{data + (j0 / mk.nr) * b.stride_ + (p0 / Packing::kStep) * mk.nr, b.stride_};
    const int threads = product_threads(m, n, k);
    if constexpr (std::is_same_v<Packing, PlainPacking<AsIs, float>>) {
      if (mk.direct != nullptr && threads == 1)
        return gemm_detail::direct_a_product(mk, trans_a, m, n, k, a, lda, part, accumulate, c, ldc);
    }
    gemm_packed(mk, packing, threads, Operand<T>{a, lda, trans_a}, part, m, n, k, accumulate, c, ldc, {});
  });
}

void gemm_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                   const PackedB<float>& b, int64_t p0, int64_t j0, bool accumulate, float* c, int64_t ldc) {
  LOOM_CHECK(j0 % 32 == 0 && p0 % 2 == 0 && (k % 2 == 0 || p0 + k == b.k_));
  LOOM_CHECK(p0 >= 0 && j0 >= 0 && p0 + k <= b.k_ && j0 + n <= b.n_);
  LOOM_CHECK(!b.blas_ && b.operands_ != DType::kF32);
  if (trivial_product(m, n, k, accumulate, c, ldc, {}, {})) return;
  on_kernel<float>(b.operands_, b.path_, [&](const auto& mk, const auto& packing) {
    using Packing = std::decay_t<decltype(packing)>;
    using P = typename Packing::P;
    if constexpr (!std::is_same_v<Packing, PlainPacking<AsIs, float>>) {
      const P* data = reinterpret_cast<const P*>(b.data_.get());
      const Prepacked<P> part{data + (j0 / mk.nr) * b.stride_ + (p0 / Packing::kStep) * mk.nr, b.stride_};
      gemm_packed(mk, packing, product_threads(m, n, k), Operand<uint16_t>{a, lda, trans_a}, part, m, n, k, accumulate,
                  c, ldc, {});
    }
  });
}

namespace gemm_detail {

template <typename ValueA>
void gemm_half_amx_twin(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const ValueA* a, int64_t lda,
                        const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  static const MicroKernel<uint32_t, float> twin = {"amx (twin)", kAmxRows, kAmxCols, kAmxKc, kAmxMc, kAmxNc, kAmxMc,
                                                    microkernel_amx_twin, nullptr};
  if (trivial_product(m, n, k, accumulate, c, ldc, {}, {})) return;
  gemm_packed(twin, AmxPacking{}, product_threads(m, n, k), Operand<ValueA>{a, lda, trans_a},
              Operand<float>{b, ldb, trans_b}, m, n, k, accumulate, c, ldc, {});
}
template void gemm_half_amx_twin<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                        int64_t, bool, float*, int64_t);
template void gemm_half_amx_twin<uint16_t>(bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                                           const float*, int64_t, bool, float*, int64_t);

}  // namespace gemm_detail

template class PackedB<float>;
template class PackedB<double>;
template void gemm_packed_b<float>(bool, int64_t, int64_t, int64_t, const float*, int64_t, const PackedB<float>&,
                                   int64_t, int64_t, bool, float*, int64_t);
template void gemm_packed_b<double>(bool, int64_t, int64_t, int64_t, const double*, int64_t, const PackedB<double>&,
                                    int64_t, int64_t, bool, double*, int64_t);

namespace {

// GFLOP/s of `threads` threads running a kernel's register-only peak loop for `seconds`.
double peak_gflops(double (*loop)(int64_t, float*), int threads, double seconds) {
  float sink = 0;
  int64_t iters = 1 << 20;
  for (;;) {
    const double t0 = omp_get_wtime();
    double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink)
    flops += loop(iters, &sink);
    const double dt = omp_get_wtime() - t0;
    if (dt >= seconds) return sink == 12345.0f ? 0 : flops / dt / 1e9;  // keeps sink live
    iters = static_cast<int64_t>(static_cast<double>(iters) * std::min(8.0, 1.2 * seconds / std::max(dt, 1e-6)));
  }
}

}  // namespace

double fma_peak_gflops(GemmPath path, int threads, double seconds) {
  LOOM_CHECK(gemm_path_supported(path));
  return peak_gflops(kernel_for(path).fma_loop, threads, seconds);
}

double bf16_peak_gflops(int threads, double seconds) {
  LOOM_CHECK(gemm_path_supported(GemmPath::kAvx512Bf16));
  return peak_gflops(gemm_detail::kAvx512Bf16Kernel.fma_loop, threads, seconds);
}

double half_peak_gflops(GemmPath path, int threads, double seconds) {
  LOOM_CHECK(gemm_path_supported(path));
  if (path == GemmPath::kAmx) return peak_gflops(gemm_detail::kAmxKernel.fma_loop, threads, seconds);
  if (path == GemmPath::kAvx512Bf16) return bf16_peak_gflops(threads, seconds);
  return fma_peak_gflops(path, threads, seconds);
}

namespace {

// The OpenBLAS backend (job.gemm = "openblas"): C = [C +] op(A) op(B), beta 1 or 0.
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  openblas().sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
               const double* b, int64_t ldb, bool accumulate, double* c, int64_t ldc) {
  openblas().dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c, ldc);
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, const GemmEpilogue<T>& epilogue,
          const GemmPrologue<T>& prologue) {
  if (g_backend == GemmBackend::kOpenBlas) {
    if (m == 0 || n == 0) return;
    start_whole(prologue, m, n, c, ldc, accumulate);
    blas_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    if (epilogue) epilogue.fn(0, m, 0, n, c, ldc);
  } else if constexpr (std::is_same_v<T, float>) {
    LOOM_CHECK(gemm_path_supported(g_path));
    gemm_loom(kernel_for(g_path), trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  } else {
    gemm_loom(kGenericF64, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  }
}

template <typename T>
void gemm_as(DType operands, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
             const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, const GemmEpilogue<T>& epilogue,
             const GemmPrologue<T>& prologue) {
  if constexpr (std::is_same_v<T, float>) {
    if (operands != DType::kF32)
      return gemm_half(operands, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  } else {
    LOOM_CHECK(operands == DType::kF32);
  }
  gemm<T>(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
}

template void gemm_as<float>(DType, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                             int64_t, bool, float*, int64_t, const GemmEpilogue<float>&, const GemmPrologue<float>&);
template void gemm_as<double>(DType, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*,
                              int64_t, bool, double*, int64_t, const GemmEpilogue<double>&,
                              const GemmPrologue<double>&);
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                          int64_t, bool, float*, int64_t, const GemmEpilogue<float>&, const GemmPrologue<float>&);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           bool, double*, int64_t, const GemmEpilogue<double>&, const GemmPrologue<double>&);

}  // namespace loom::kernels
