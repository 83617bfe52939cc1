// Loom's GEMM driver: output tiles across threads, packing, micro-kernel dispatch; and the
// OpenBLAS backend kept for comparison. See gemm.h for the contract and the order of
// arithmetic, microkernel.h for the micro-kernel contract.
#include "kernels/gemm/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/skinny.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

using gemm_detail::kParallelMinWork;
using gemm_detail::MicroKernel;

const MicroKernel<float> kGenericF32 = {"generic", 4, 16, 256, 240, 256, 240,
                                        gemm_detail::microkernel_generic<float, 4, 16>,
                                        gemm_detail::fma_loop_generic};
const MicroKernel<double> kGenericF64 = {"generic", 4, 8, 256, 240, 256, 240,
                                         gemm_detail::microkernel_generic<double, 4, 8>,
                                         gemm_detail::fma_loop_generic};

std::atomic<GemmPath> g_path{GemmPath::kAuto};
std::atomic<GemmBackend> g_backend{GemmBackend::kLoom};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Per-thread packing space, 64-byte aligned (the kernels' aligned loads need it), grown on
// demand and kept for the thread's life.
template <typename T>
T* scratch(int slot, int64_t count) {
  struct Buffer {
    std::unique_ptr<T, decltype(&std::free)> data{nullptr, &std::free};
    int64_t capacity = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& buf = buffers[slot];
  if (buf.capacity < count) {
    const size_t bytes = static_cast<size_t>(round_up(count * int64_t{sizeof(T)}, 64));
    buf.data.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    // Called inside OpenMP regions, where an exception cannot propagate: a failed
    // allocation of these few MiB aborts with the check's message instead.
    LOOM_CHECK(buf.data != nullptr);
    buf.capacity = count;
  }
  return buf.data.get();
}

// A view of op(X): element (i, j) of the logical matrix.
template <typename T>
struct Operand {
  const T* p;
  int64_t ld;
  bool trans;
};

// A full sliver of MR rows of an untransposed A, column by column: the MR values of one
// column are read side by side and written together. Row by row, the writes fell MR values
// apart; this order took packing A from 28% to 11% of a 2048 x 256 x 1024 NT product's time
// (the input gradient of gpt-mini's fc), and from 5% to 2% of a square 2048 one.
template <int MR, typename T>
void pack_a_columns(const T* src, int64_t ld, int64_t kc, T* out) {
  for (int64_t q = 0; q < kc; ++q, out += MR) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) out[r] = src[r * ld + q];
  }
}

// out[q * mr + r] = op(A)(i0 + r, p0 + q) for r < rows, zero for rows <= r < mr.
template <typename T>
void pack_a(const Operand<T>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out) {
  if (!a.trans && rows == mr) {  // every kernel's MR: AVX-512 12, AVX2 6, generic 4
    const T* src = a.p + i0 * a.ld + p0;
    if (mr == 12) return pack_a_columns<12>(src, a.ld, kc, out);
    if (mr == 6) return pack_a_columns<6>(src, a.ld, kc, out);
    if (mr == 4) return pack_a_columns<4>(src, a.ld, kc, out);
  }
  if (!a.trans) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = a.p + (i0 + r) * a.ld + p0;
      for (int64_t q = 0; q < kc; ++q) out[q * mr + r] = src[q];
    }
  } else {
    for (int64_t q = 0; q < kc; ++q)
      std::memcpy(out + q * mr, a.p + (p0 + q) * a.ld + i0, rows * sizeof(T));
  }
  if (rows < mr)
    for (int64_t q = 0; q < kc; ++q) std::fill(out + q * mr + rows, out + (q + 1) * mr, T(0));
}

// NR-column slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols), each kc x nr, p-major, zero-padded.
template <typename T>
void pack_b(const Operand<T>& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) {
  for (int64_t s = 0; s * nr < cols; ++s) {
    T* dst = out + s * kc * nr;
    const int64_t js = j0 + s * nr, width = std::min<int64_t>(nr, cols - s * nr);
    if (!b.trans) {
      for (int64_t q = 0; q < kc; ++q) {
        std::memcpy(dst + q * nr, b.p + (p0 + q) * b.ld + js, width * sizeof(T));
        std::fill(dst + q * nr + width, dst + (q + 1) * nr, T(0));
      }
    } else {
      // Transposing: 32 values of k at a time, so the slice of the sliver being written
      // (32 rows of nr) stays in L1 while every source row is read.
      for (int64_t q0 = 0; q0 < kc; q0 += 32) {
        const int64_t depth = std::min<int64_t>(32, kc - q0);
        for (int64_t j = 0; j < width; ++j) {
          const T* src = b.p + (js + j) * b.ld + p0 + q0;
          for (int64_t q = 0; q < depth; ++q) dst[(q0 + q) * nr + j] = src[q];
        }
      }
      if (width < nr)
        for (int64_t q = 0; q < kc; ++q) std::fill(dst + q * nr + width, dst + (q + 1) * nr, T(0));
    }
  }
}

// One output tile, rows [i0, i0 + rows) x columns [j0, j0 + cols), over all of k. Per KC
// block, the tile's rows of op(A) are packed once into MR-row slivers; then per NC-wide
// panel of op(B) (packed, meant to stay in L2) every A sliver meets every B sliver.
template <typename T>
void run_tile(const MicroKernel<T>& mk,
              const Operand<T>& a,
              const Operand<T>& b,
              int64_t k,
              bool accumulate,
              T* c,
              int64_t ldc,
              int64_t i0,
              int64_t rows,
              int64_t j0,
              int64_t cols,
              const GemmEpilogue& epilogue) {
  const int mr = mk.mr, nr = mk.nr;
  T* packed_a = scratch<T>(0, mk.kc * round_up(rows, mr));
  T* packed_b = scratch<T>(1, mk.kc * round_up(std::min(cols, mk.nc), nr));
  alignas(64) T edge[32 * 32];  // one partial MR x NR block (every kernel has MR, NR <= 32)
  for (int64_t p0 = 0; p0 < k; p0 += mk.kc) {
    const int64_t kc = std::min(mk.kc, k - p0);
    const bool acc = accumulate || p0 > 0;  // later blocks continue each element's chain
    for (int64_t ir = 0; ir < rows; ir += mr)
      pack_a(a, i0 + ir, std::min<int64_t>(mr, rows - ir), p0, kc, mr, packed_a + ir * kc);
    for (int64_t jc = 0; jc < cols; jc += mk.nc) {
      const int64_t panel = std::min(mk.nc, cols - jc);
      pack_b(b, p0, kc, j0 + jc, panel, nr, packed_b);
      for (int64_t ir = 0; ir < rows; ir += mr) {
        const int64_t h = std::min<int64_t>(mr, rows - ir);
        const T* pa = packed_a + ir * kc;
        for (int64_t jr = 0; jr < panel; jr += nr) {
          const int64_t w = std::min<int64_t>(nr, panel - jr);
          const T* pb = packed_b + jr * kc;
          T* ct = c + (i0 + ir) * ldc + j0 + jc + jr;
          if (h == mr && w == nr) {
            mk.fn(kc, pa, pb, ct, ldc, acc);
            continue;
          }
          // Partial block: run the full kernel on a copy; padded lanes are discarded.
          if (acc)
            for (int64_t r = 0; r < h; ++r) std::memcpy(edge + r * nr, ct + r * ldc, w * sizeof(T));
          mk.fn(kc, pa, pb, edge, nr, acc);
          for (int64_t r = 0; r < h; ++r) std::memcpy(ct + r * ldc, edge + r * nr, w * sizeof(T));
        }
      }
    }
  }
  if (epilogue) epilogue(i0, rows, j0, cols);  // every element of the tile is final
}

// Cuts C into tiles (multiples of MR rows and NR columns) and hands whole tiles to
// threads; no split touches k, so the bits do not depend on the thread count.
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
               const GemmEpilogue& epilogue) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    if (epilogue) epilogue(0, m, 0, n);
    return;
  }
  // Inside any parallel region (omp_get_level, unlike omp_in_parallel, counts a team of
  // one too) a product runs on its caller's thread, and one thread never enters a parallel
  // construct: even a team of one costs a microsecond, a sixth of a 64 x 64 x 64 product.
  const bool parallel = omp_get_level() == 0 && m * n * k >= kParallelMinWork;
  const int threads = parallel ? omp_get_max_threads() : 1;
  if (m <= gemm_detail::kSkinnyRows && !trans_a) {  // a few rows: no packing (skinny.h)
    const int64_t chunk = round_up(ceil_div(n, threads), 16);
    const auto block = [&](int64_t j0) {
      const int64_t cols = std::min(chunk, n - j0);
      gemm_detail::skinny_block(m, k, a, lda, b, ldb, trans_b, accumulate, c, ldc, j0, cols);
      if (epilogue) epilogue(0, m, j0, cols);
    };
    if (threads == 1) {
      for (int64_t j0 = 0; j0 < n; j0 += chunk) block(j0);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t j0 = 0; j0 < n; j0 += chunk) block(j0);
    return;
  }
  const Operand<T> oa{a, lda, trans_a}, ob{b, ldb, trans_b};
  // Tiles start as MC rows (mc_wide where op(B) spans several panels or is transposed) by
  // every column (A is then packed once per KC block). With several threads the tile count
  // is raised to a multiple of the thread count, so no thread idles at the end. A cut across rows repacks op(B) once more (n x k), a cut
  // across columns op(A) (m x k): the cheaper one goes first, while tiles keep at least
  // 2 MR rows and NR columns.
  int64_t tm = ceil_div(m, n > mk.nc || trans_b ? mk.mc_wide : mk.mc), tn = 1;
  while (threads > 1 && (tm * tn) % threads != 0) {
    const bool rows_ok = ceil_div(m, tm + 1) >= 2 * mk.mr, cols_ok = ceil_div(n, tn + 1) >= mk.nr;
    if (rows_ok && (n <= m || !cols_ok)) {
      ++tm;
    } else if (cols_ok) {
      ++tn;
    } else {
      break;
    }
  }
  const int64_t mc = round_up(ceil_div(m, tm), mk.mr), nc = round_up(ceil_div(n, tn), mk.nr);
  const int64_t tiles_n = ceil_div(n, nc), tiles = ceil_div(m, mc) * tiles_n;
  const auto tile = [&](int64_t t) {
    const int64_t i0 = (t / tiles_n) * mc, j0 = (t % tiles_n) * nc;
    run_tile(mk, oa, ob, k, accumulate, c, ldc, i0, std::min(mc, m - i0), j0, std::min(nc, n - j0), epilogue);
  };
  if (threads == 1) {
    for (int64_t t = 0; t < tiles; ++t) tile(t);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tiles; ++t) tile(t);
}

const MicroKernel<float>& kernel_for(GemmPath path) {
  switch (path == GemmPath::kAuto ? gemm_best_path() : path) {
    case GemmPath::kAvx512:
      return gemm_detail::kAvx512Kernel;
    case GemmPath::kAvx2:
      return gemm_detail::kAvx2Kernel;
    default:
      return kGenericF32;
  }
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");  // libgcc also checks the OS saves zmm state
}
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

bool gemm_path_supported(GemmPath path) {
  switch (path) {
    case GemmPath::kAvx512:
      return cpu_has_avx512();
    case GemmPath::kAvx2:
      return cpu_has_avx2();
    default:
      return true;
  }
}

GemmPath gemm_best_path() {
  static const GemmPath best = cpu_has_avx512() ? GemmPath::kAvx512
                               : cpu_has_avx2() ? GemmPath::kAvx2
                                                : GemmPath::kGeneric;
  return best;
}

namespace {
// Each path's name, as job.gemm_path spells it.
constexpr std::pair<GemmPath, const char*> kPathNames[] = {{GemmPath::kAuto, "auto"},
                                                           {GemmPath::kAvx512, "avx512"},
                                                           {GemmPath::kAvx2, "avx2"},
                                                           {GemmPath::kGeneric, "generic"}};
}  // namespace

const char* gemm_path_name(GemmPath path) {
  for (const auto& [p, name] : kPathNames)
    if (p == path) return name;
  LOOM_CHECK(false);
  return "";
}

GemmPath gemm_path_named(const std::string& name) {
  for (const auto& [p, n] : kPathNames)
    if (name == n) return p;
  throw InputError(cat("gemm path \"", name, "\": expected one of auto, avx512, avx2, generic"));
}

std::vector<GemmPath> gemm_supported_paths() {
  std::vector<GemmPath> paths;
  for (GemmPath p : {GemmPath::kAvx512, GemmPath::kAvx2, GemmPath::kGeneric})
    if (gemm_path_supported(p)) paths.push_back(p);
  return paths;
}

void set_gemm_path(GemmPath path) {
  if (!gemm_path_supported(path))
    throw InputError(cat("gemm path '", gemm_path_name(path), "' needs ",
                         path == GemmPath::kAvx512 ? "AVX-512F" : "AVX2 and FMA",
                         ", which this CPU does not report"));
  g_path = path;
}
GemmPath gemm_active_path() { return g_path == GemmPath::kAuto ? gemm_best_path() : g_path.load(); }
void set_gemm_backend(GemmBackend backend) { g_backend = backend; }

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

double fma_peak_gflops(GemmPath path, int threads, double seconds) {
  LOOM_CHECK(gemm_path_supported(path));
  const MicroKernel<float>& mk = kernel_for(path);
  float sink = 0;
  int64_t iters = 1 << 20;
  for (;;) {
    const double t0 = omp_get_wtime();
    double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink)
    flops += mk.fma_loop(iters, &sink);
    const double dt = omp_get_wtime() - t0;
    if (dt >= seconds) return sink == 12345.0f ? 0 : flops / dt / 1e9;  // keeps sink live
    iters = static_cast<int64_t>(static_cast<double>(iters) * std::min(8.0, 1.2 * seconds / std::max(dt, 1e-6)));
  }
}

namespace {

// The OpenBLAS backend (job.gemm = "openblas"): C = [C +] op(A) op(B), beta 1 or 0.
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
               const double* b, int64_t ldb, bool accumulate, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c, ldc);
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, const GemmEpilogue& epilogue) {
  if (g_backend == GemmBackend::kOpenBlas) {
    if (m == 0 || n == 0) return;
    blas_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    if (epilogue) epilogue(0, m, 0, n);
  } else if constexpr (std::is_same_v<T, float>) {
    LOOM_CHECK(gemm_path_supported(g_path));
    gemm_loom(kernel_for(g_path), trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue);
  } else {
    gemm_loom(kGenericF64, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                          int64_t, bool, float*, int64_t, const GemmEpilogue&);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, bool, double*, int64_t, const GemmEpilogue&);

}  // namespace loom::kernels
