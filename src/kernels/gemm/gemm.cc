// Loom's GEMM driver: output tiles across threads, packing, micro-kernel dispatch; and the
// OpenBLAS backend kept for comparison. See gemm.h for the contract and the order of
// arithmetic, microkernel.h for the micro-kernel contract.
#include "kernels/gemm/gemm.h"

#include <cblas.h>
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

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/skinny.h"
#include "kernels/precision.h"
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

// Packed pairs for vdpbf16ps (microkernel.h): op(X)'s values k = p and p + 1 as one
// uint32_t, p in the upper half (multiplied first), converted by the AVX512_BF16 packers.
// An odd last k is paired with -0 in A and +0 in B: their product, -0, leaves every
// accumulator as it is (x + -0 = x, for x = -0 too).
constexpr uint32_t kPadA = 0x8000u, kPadB = 0x0000u;

// An operand's value: an f32 as it is, bf16 bits as the f32 they hold.
float operand_value(float x) { return x; }
float operand_value(uint16_t bits) { return bf16_value(bits); }

// The pairs of an odd block's last k (row `last` of op(X), values i < count), each with the
// pad in its lower half, into slivers `width` wide and `sliver` apart at pair index `pairs`.
template <typename Value>
void pack_last_k(const Value* last, int64_t count, uint32_t pad, int64_t pairs, int64_t width, int64_t sliver,
                 uint32_t* out) {
  for (int64_t i = 0; i < count; ++i)
    out[(i / width) * sliver + pairs * width + i % width] =
        static_cast<uint32_t>(bf16_operand_bits(operand_value(last[i]))) << 16 | pad;
}

// Lanes count .. width - 1 of a last partial sliver (depth steps of width; slivers `stride`
// apart) set to zero.
void zero_sliver_tail(uint32_t* sliver, int64_t count, int64_t width, int64_t depth, int64_t stride) {
  if (count % width == 0) return;
  uint32_t* s = sliver + (count / width) * stride;
  for (int64_t q = 0; q < depth; ++q) std::fill(s + q * width + count % width, s + (q + 1) * width, 0u);
}

// The packers' two sources: f32 values, or bf16 bits (16-bit storage) giving the same pairs.
void pack_rows(const float* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
               int64_t sliver) {
  gemm_detail::kAvx512Bf16Packers.rows(x, ld, count, pairs, out, width, sliver);
}
void pack_rows(const uint16_t* x, int64_t ld, int64_t count, int64_t pairs, uint32_t* out, int64_t width,
               int64_t sliver) {
  gemm_detail::kAvx512Bf16Packers.bits_rows(x, ld, count, pairs, out, width, sliver);
}
void pack_block(const float* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out, int64_t stride) {
  gemm_detail::kAvx512Bf16Packers.block(x, ld, rows, values, pad, out, stride);
}
void pack_block(const uint16_t* x, int64_t ld, int rows, int64_t values, uint32_t pad, uint32_t* out,
                int64_t stride) {
  gemm_detail::kAvx512Bf16Packers.bits_block(x, ld, rows, values, pad, out, stride);
}

// A tile's MR-row slivers of op(A) (rows [i0, i0 + rows) x k [p0, p0 + kc)) as pairs, sliver
// s at out + s * stride (PairPacking::a_stride): out[q * mr + r] of a sliver = the pair
// (op(A)(r, p0 + 2q), op(A)(r, p0 + 2q + 1)); rows past the tile zero. A transposed A (a
// weight gradient's activations) is read a row pair at a time across the whole tile: sliver
// by sliver, each read took 48 bytes from rows thousands of bytes apart. Value: float, or
// uint16_t (bf16 bits: the same pairs).
template <typename Value>
void pack_a_pairs(const Operand<Value>& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, uint32_t* out,
                  int64_t stride) {
  const int64_t pairs = kc / 2, depth = (kc + 1) / 2;
  if (!a.trans) {
    for (int64_t r = 0; r < rows; r += mr)  // MR <= 16: one block per sliver
      pack_block(a.p + (i0 + r) * a.ld + p0, a.ld, static_cast<int>(std::min<int64_t>(mr, rows - r)), kc, kPadA,
                 out + (r / mr) * stride, mr);
  } else {
    pack_rows(a.p + p0 * a.ld + i0, a.ld, rows, pairs, out, mr, stride);
    if (kc & 1) pack_last_k(a.p + (p0 + kc - 1) * a.ld + i0, rows, kPadA, pairs, mr, stride, out);
  }
  zero_sliver_tail(out, rows, mr, depth, stride);
}

// NR-column slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols) as pairs, each depth x nr.
template <typename Value>
void pack_b_pairs(const Operand<Value>& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, uint32_t* out) {
  const int64_t pairs = kc / 2, depth = (kc + 1) / 2;
  if (!b.trans) {
    pack_rows(b.p + p0 * b.ld + j0, b.ld, cols, pairs, out, nr, nr * depth);
    if (kc & 1) pack_last_k(b.p + (p0 + kc - 1) * b.ld + j0, cols, kPadB, pairs, nr, nr * depth, out);
  } else {
    for (int64_t j = 0; j < cols; j += 16)
      pack_block(b.p + (j0 + j) * b.ld + p0, b.ld, static_cast<int>(std::min<int64_t>(16, cols - j)), kc, kPadB,
                 out + (j / nr) * nr * depth + j % nr, nr);
  }
  zero_sliver_tail(out, cols, nr, depth, nr * depth);
}

// MXCSR's flush-to-zero and denormals-are-zero bits set on this thread while it lives: the
// f32 SIMD kernels then compute bf16 products as vdpbf16ps does (microkernel.h).
class FlushSubnormals {
 public:
  explicit FlushSubnormals(bool on) : saved_(_mm_getcsr()), on_(on) { resume(); }
  ~FlushSubnormals() { suspend(); }
  // The caller's MXCSR back while code that is not a product runs (an epilogue), then set again.
  void suspend() const {
    if (on_) _mm_setcsr(saved_);
  }
  void resume() const {
    if (on_) _mm_setcsr(saved_ | 0x8040u);
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
  bool on_;
};

// What an f32 or f64 sliver holds for a value of the operand: the value itself, or the value
// a 16-bit product multiplies (gemm_half on the f32 kernels).
struct AsIs {};
struct AsBf16 {
  static float value(float x) { return bf16_operand(x); }
};
struct AsF16 {
  static float value(float x) { return f16_operand(x); }
};

// `count` packed values converted in place: one pass over the sliver just written, while
// it is in cache, in a loop the compiler vectorizes (converting each value as it was
// packed, at scattered places, held an fp16 gpt-mini step at 783 ms on one core; this pass,
// 693 ms).
template <typename Cvt, typename T>
void convert(T* x, int64_t count) {
  if constexpr (!std::is_same_v<Cvt, AsIs>)
    for (int64_t i = 0; i < count; ++i) x[i] = Cvt::value(x[i]);
}

// How a product's operands are packed: plain (f32, f64), converted to 16-bit values in f32
// slivers (Cvt: AsBf16, AsF16), or as bf16 pairs; `flush` sets MXCSR's FTZ and DAZ while
// the kernel runs.
template <typename Cvt, typename T>
struct PlainPacking {
  using P = T;
  static constexpr int kStep = 1;  // values of k per packed step
  bool flush = false;
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr; }  // slivers side by side
  void a(const Operand<T>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, T* out, int64_t) const {
    for (int64_t r = 0; r < rows; r += mr) pack_a(x, i0 + r, std::min<int64_t>(mr, rows - r), p0, kc, mr, out + r * kc);
    convert<Cvt>(out, round_up(rows, mr) * kc);
  }
  void b(const Operand<T>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, T* out) const {
    pack_b(x, p0, kc, j0, cols, nr, out);
    convert<Cvt>(out, (cols + nr - 1) / nr * kc * nr);
  }
};
struct PairPacking {
  using P = uint32_t;
  static constexpr int kStep = 2;
  bool flush = false;
  // A's slivers one cache line further apart than their size: a transposed A is written a row
  // pair across the whole tile at a time, to every sliver (86 of them for 1032 rows), and
  // with slivers 24 KiB apart every write fell in one L1 set. Measured on one Zen 5 core:
  // gpt-mini's weight gradients (TN, k = 2048) 300-357 -> 340-370 GFLOP/s.
  static int64_t a_stride(int64_t depth, int mr) { return depth * mr + 16; }
  template <typename Value>  // float, or uint16_t: bf16 bits
  void a(const Operand<Value>& x, int64_t i0, int64_t rows, int64_t p0, int64_t kc, int mr, uint32_t* out,
         int64_t stride) const {
    pack_a_pairs(x, i0, rows, p0, kc, mr, out, stride);
  }
  template <typename Value>
  void b(const Operand<Value>& x, int64_t p0, int64_t kc, int64_t j0, int64_t cols, int nr, uint32_t* out) const {
    pack_b_pairs(x, p0, kc, j0, cols, nr, out);
  }
};

// One output tile, rows [i0, i0 + rows) x columns [j0, j0 + cols), over all of k. Per KC
// block, the tile's rows of op(A) are packed once into MR-row slivers; then per NC-wide
// panel of op(B) (packed, meant to stay in L2) every A sliver meets every B sliver.
template <typename Packing, typename T, typename OperandA, typename OperandB>
void run_tile(const MicroKernel<typename Packing::P, T>& mk,
              const Packing& packing,
              const OperandA& a,
              const OperandB& b,
              int64_t k,
              bool accumulate,
              T* c,
              int64_t ldc,
              int64_t i0,
              int64_t rows,
              int64_t j0,
              int64_t cols,
              const GemmEpilogue& epilogue,
              const GemmPrologue& prologue) {
  using P = typename Packing::P;
  const int mr = mk.mr, nr = mk.nr;
  const auto depth_of = [](int64_t kc) { return (kc + Packing::kStep - 1) / Packing::kStep; };
  P* packed_a = scratch<P>(0, Packing::a_stride(depth_of(mk.kc), mr) * ceil_div(rows, mr));
  P* packed_b = scratch<P>(1, depth_of(mk.kc) * round_up(std::min(cols, mk.nc), nr));
  alignas(64) T edge[32 * 32];  // one partial MR x NR block (every kernel has MR, NR <= 32)
  {
    const FlushSubnormals flush(packing.flush);
    for (int64_t p0 = 0; p0 < k; p0 += mk.kc) {
      const int64_t kc = std::min(mk.kc, k - p0), depth = depth_of(kc);
      const bool start = p0 == 0 && prologue;  // the prologue writes each block's start into C
      const bool acc = accumulate || p0 > 0 || start;  // later blocks continue each element's chain
      const bool last = p0 + kc >= k;         // this block's multiply-adds are each element's last
      const int64_t a_stride = Packing::a_stride(depth, mr);
      packing.a(a, i0, rows, p0, kc, mr, packed_a, a_stride);  // every MR-row sliver, sliver s at s * a_stride
      for (int64_t jc = 0; jc < cols; jc += mk.nc) {
        const int64_t panel = std::min(mk.nc, cols - jc);
        packing.b(b, p0, kc, j0 + jc, panel, nr, packed_b);
        for (int64_t ir = 0; ir < rows; ir += mr) {
          const int64_t h = std::min<int64_t>(mr, rows - ir);
          const P* pa = packed_a + (ir / mr) * a_stride;
          if (start) {  // into L1 just before the kernels read it, with the caller's MXCSR
            flush.suspend();
            prologue(i0 + ir, h, j0 + jc, panel);
            flush.resume();
          }
          for (int64_t jr = 0; jr < panel; jr += nr) {
            const int64_t w = std::min<int64_t>(nr, panel - jr);
            const P* pb = packed_b + jr * depth;
            T* ct = c + (i0 + ir) * ldc + j0 + jc + jr;
            if (h == mr && w == nr) {
              mk.fn(depth, pa, pb, ct, ldc, acc);
              continue;
            }
            // Partial block: run the full kernel on a copy; padded lanes are discarded.
            if (acc)
              for (int64_t r = 0; r < h; ++r) std::memcpy(edge + r * nr, ct + r * ldc, w * sizeof(T));
            mk.fn(depth, pa, pb, edge, nr, acc);
            for (int64_t r = 0; r < h; ++r) std::memcpy(ct + r * ldc, edge + r * nr, w * sizeof(T));
          }
          // The sliver's MR rows of this panel are final: the epilogue takes them while they
          // are in L1 (12 KiB for bf16's 12 x 256), where the whole tile (up to 1032 rows by
          // every column, megabytes) would have left the cache; with the caller's MXCSR.
          if (epilogue && last) {
            flush.suspend();
            epilogue(i0 + ir, h, j0 + jc, panel);
            flush.resume();
          }
        }
      }
    }
  }
}

// Whether a product of m x n x k runs on the OpenMP pool, and on how many threads. Inside
// any parallel region (omp_get_level, unlike omp_in_parallel, counts a team of one too) a
// product runs on its caller's thread, and one thread never enters a parallel construct:
// even a team of one costs a microsecond, a sixth of a 64 x 64 x 64 product.
int product_threads(int64_t m, int64_t n, int64_t k) {
  const bool parallel = omp_get_level() == 0 && m * n * k >= kParallelMinWork;
  return parallel ? omp_get_max_threads() : 1;
}

// Where a product does not run by packed tiles: the prologue over all of C first, which
// the product then accumulates onto.
void start_whole(const GemmPrologue& prologue, int64_t m, int64_t n, bool& accumulate) {
  LOOM_CHECK(!(prologue && accumulate));
  if (!prologue || m == 0 || n == 0) return;
  prologue(0, m, 0, n);
  accumulate = true;
}

// k == 0 (or an empty C): C kept (accumulate), the prologue's or zeroed, then the epilogue.
// True when the product is done.
template <typename T>
bool trivial_product(int64_t m, int64_t n, int64_t k, bool accumulate, T* c, int64_t ldc, const GemmEpilogue& epilogue,
                     const GemmPrologue& prologue) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  start_whole(prologue, m, n, accumulate);
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  if (epilogue) epilogue(0, m, 0, n);
  return true;
}

// Cuts C into tiles (multiples of MR rows and NR columns) and hands whole tiles to
// threads; no split touches k, so the bits do not depend on the thread count.
template <typename Packing, typename T, typename OperandA, typename OperandB>
void gemm_packed(const MicroKernel<typename Packing::P, T>& mk,
                 const Packing& packing,
                 int threads,
                 const OperandA& oa,
                 const OperandB& ob,
                 int64_t m,
                 int64_t n,
                 int64_t k,
                 bool accumulate,
                 T* c,
                 int64_t ldc,
                 const GemmEpilogue& epilogue,
                 const GemmPrologue& prologue = {}) {
  LOOM_CHECK(!(prologue && accumulate));
  // Tiles start as MC rows (mc_wide where op(B) spans several panels or is transposed) by
  // every column (A is then packed once per KC block). With several threads the tile count
  // is raised to a multiple of the thread count, so no thread idles at the end. A cut across rows repacks op(B) once more (n x k), a cut
  // across columns op(A) (m x k): the cheaper one goes first, while tiles keep at least
  // 2 MR rows and NR columns.
  int64_t tm = ceil_div(m, n > mk.nc || ob.trans ? mk.mc_wide : mk.mc), tn = 1;
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
    run_tile(mk, packing, oa, ob, k, accumulate, c, ldc, i0, std::min(mc, m - i0), j0, std::min(nc, n - j0), epilogue,
             prologue);
  };
  if (threads == 1) {
    for (int64_t t = 0; t < tiles; ++t) tile(t);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tiles; ++t) tile(t);
}

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
               const GemmEpilogue& epilogue,
               const GemmPrologue& prologue = {}) {
  if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
  const int threads = product_threads(m, n, k);
  if (m <= gemm_detail::kSkinnyRows && !trans_a) {  // a few rows: no packing (skinny.h)
    start_whole(prologue, m, n, accumulate);
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
  gemm_packed(mk, PlainPacking<AsIs, T>{}, threads, Operand<T>{a, lda, trans_a}, Operand<T>{b, ldb, trans_b}, m, n, k,
              accumulate, c, ldc, epilogue, prologue);
}

// The f32 kernel of a path (AVX512_BF16's f32 products are AVX-512F's).
const MicroKernel<float>& kernel_for(GemmPath path) {
  switch (path == GemmPath::kAuto ? gemm_best_path() : path) {
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
                         path == GemmPath::kAvx512Bf16 ? "AVX512_BF16"
                         : path == GemmPath::kAvx512   ? "AVX-512F"
                                                       : "AVX2 and FMA",
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

namespace {

const MicroKernel<float> kGenericBf16 = {"generic", 4, 16, 256, 240, 256, 240,
                                         gemm_detail::microkernel_generic_ftz<4, 16>,
                                         gemm_detail::fma_loop_generic};

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
                    const GemmEpilogue& epilogue,
                    const GemmPrologue& prologue = {}) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  LOOM_CHECK(gemm_path_supported(path));
  if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
  const int threads = product_threads(m, n, k);
  const Operand<float> oa{a, lda, trans_a}, ob{b, ldb, trans_b};
  if (path == GemmPath::kAuto) path = gemm_best_half_path();
  if (format == DType::kF16) {  // f16 values are exact in f32: the f32 kernels, no flushing
    gemm_packed(kernel_for(path), PlainPacking<AsF16, float>{}, threads, oa, ob, m, n, k, accumulate, c, ldc, epilogue,
                prologue);
  } else if (path == GemmPath::kAvx512Bf16) {
    gemm_packed(gemm_detail::kAvx512Bf16Kernel, PairPacking{}, threads, oa, ob, m, n, k, accumulate, c, ldc, epilogue,
                prologue);
  } else if (path == GemmPath::kGeneric) {
    gemm_packed(kGenericBf16, PlainPacking<AsBf16, float>{}, threads, oa, ob, m, n, k, accumulate, c, ldc, epilogue,
                prologue);
  } else {
    gemm_packed(kernel_for(path), PlainPacking<AsBf16, float>{true}, threads, oa, ob, m, n, k, accumulate, c, ldc,
                epilogue, prologue);
  }
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
               const GemmEpilogue& epilogue,
               const GemmPrologue& prologue) {
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

// vdpbf16ps packs bits straight into pairs; elsewhere they are converted to their f32 values
// first, which gemm_half reads: the same bits.
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
                    const GemmEpilogue& epilogue,
                    const GemmPrologue& prologue) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  const GemmPath path = g_path == GemmPath::kAuto ? gemm_best_half_path() : g_path.load();
  if (g_backend == GemmBackend::kLoom && format == DType::kBF16 && path == GemmPath::kAvx512Bf16) {
    LOOM_CHECK(gemm_path_supported(path));
    if (trivial_product(m, n, k, accumulate, c, ldc, epilogue, prologue)) return;
    gemm_packed(gemm_detail::kAvx512Bf16Kernel, PairPacking{}, product_threads(m, n, k),
                Operand<uint16_t>{a, lda, trans_a}, Operand<ValueB>{b, ldb, trans_b}, m, n, k, accumulate, c, ldc,
                epilogue, prologue);
    return;
  }
  thread_local std::vector<float> a_values, b_values;
  gemm_half(format, trans_a, trans_b, m, n, k,
            f32_values(format, a, trans_a ? k : m, trans_a ? m : k, lda, a_values), lda,
            f32_values(format, b, trans_b ? n : k, trans_b ? k : n, ldb, b_values), ldb, accumulate, c, ldc,
            epilogue, prologue);
}

template void gemm_half_bits<float>(DType, bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                                    const float*, int64_t, bool, float*, int64_t, const GemmEpilogue&,
                                    const GemmPrologue&);
template void gemm_half_bits<uint16_t>(DType, bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                                       const uint16_t*, int64_t, bool, float*, int64_t, const GemmEpilogue&,
                                       const GemmPrologue&);

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
          const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, const GemmEpilogue& epilogue,
          const GemmPrologue& prologue) {
  if (g_backend == GemmBackend::kOpenBlas) {
    if (m == 0 || n == 0) return;
    start_whole(prologue, m, n, accumulate);
    blas_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    if (epilogue) epilogue(0, m, 0, n);
  } else if constexpr (std::is_same_v<T, float>) {
    LOOM_CHECK(gemm_path_supported(g_path));
    gemm_loom(kernel_for(g_path), trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  } else {
    gemm_loom(kGenericF64, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  }
}

template <typename T>
void gemm_as(DType operands, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
             const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, const GemmEpilogue& epilogue,
             const GemmPrologue& prologue) {
  if constexpr (std::is_same_v<T, float>) {
    if (operands != DType::kF32)
      return gemm_half(operands, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
  } else {
    LOOM_CHECK(operands == DType::kF32);
  }
  gemm<T>(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc, epilogue, prologue);
}

template void gemm_as<float>(DType, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                             int64_t, bool, float*, int64_t, const GemmEpilogue&, const GemmPrologue&);
template void gemm_as<double>(DType, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*,
                              int64_t, bool, double*, int64_t, const GemmEpilogue&, const GemmPrologue&);
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                          int64_t, bool, float*, int64_t, const GemmEpilogue&, const GemmPrologue&);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, bool, double*, int64_t, const GemmEpilogue&, const GemmPrologue&);

}  // namespace loom::kernels
