// Loom's GEMM: C (m, n) (+)= op(A) (m, k) @ op(B) (k, n), row-major, leading dimensions in
// elements. Every matrix product in Loom goes through gemm() (src/kernels/matmul.h).
//
// Structure (GotoBLAS / BLIS): the output is cut into tiles of at most MC rows; per tile
// and per block of KC along k, the tile's rows of op(A) are packed once into MR-row
// slivers, then per NC-wide panel of op(B) (packed into NR-wide slivers) a register-blocked
// micro-kernel updates each MR x NR block of C. Threads take whole output tiles, never a
// part of k.
//
// The order of arithmetic is fixed by design (docs/numerics.md, "Loom's GEMM"): every
// output element is one chain of fused multiply-adds over k = 0, 1, ..., k-1, starting
// from C (accumulate) or from +0. So the AVX-512, AVX2 and generic micro-kernels and the
// plain-loop reference (reference::gemm) give the same bits, for any tile sizes, any thread
// count and any CPU.
//
// Thread-safety: reentrant. Inside an OpenMP parallel region a call runs on its caller's
// thread only. set_gemm_path() and set_gemm_backend() are process-wide: call them before
// starting work, from one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::kernels {

// Which micro-kernels compute products. kAuto picks the widest this CPU supports (CPUID,
// checked at run time: one binary runs on every x86-64). f64 always uses the generic one.
// kAvx512Bf16 computes bf16 products with vdpbf16ps and f32 ones as kAvx512 does; the
// other paths compute bf16 products on their f32 kernels with the same bits (gemm_half).
// kAmx computes bf16 products on AMX tiles (tdpbf16ps), whose sums go in another order and
// so give other bits (reference::gemm_half_amx's), and the rest as kAvx512 does; kAuto never
// picks it (docs/numerics.md, "16-bit products": not yet run on a CPU with AMX).
enum class GemmPath { kAuto, kAmx, kAvx512Bf16, kAvx512, kAvx2, kGeneric };

// Who computes products: Loom's GEMM, or OpenBLAS (kept for comparison and as a second
// oracle; its bits depend on the kernels it picks for the CPU and on the thread count).
enum class GemmBackend { kLoom, kOpenBlas };

// A caller's code over a block of C, rows [i0, i0 + rows) x columns [j0, j0 + cols), whose
// first element is at `block`, rows `ld` apart: C's own (c + i0 * ldc + j0, ldc), or with
// GemmEpilogue::scratch a buffer of the thread's.
template <typename T>
using GemmBlockFn = std::function<void(int64_t i0, int64_t rows, int64_t j0, int64_t cols, T* block, int64_t ld)>;

// What a caller does to each finished block of C while it is still in cache (an activation:
// one pass over C fewer). It runs on the thread that computed the block, once per element,
// after the element's last FMA; blocks are disjoint and cover C.
template <typename T>
struct GemmEpilogue {
  GemmBlockFn<T> fn;
  // C's values are only the epilogue's (a GELU's input kept in 16 bits, a gradient that
  // leaves the product in 16 bits): where the product passes over k once (its depth fits
  // one packed block) and does not accumulate, each block is computed in a buffer of the
  // thread's, in L1, and C is never written; elsewhere C is written as without it. Either
  // way C's contents are unspecified after the call. (Megabytes of f32 written to memory
  // for nothing: about 0.5 ms of each 7 ms c_fc product in a bf16 gpt-mini step.)
  bool scratch = false;

  GemmEpilogue() = default;
  template <typename F>
    requires std::is_invocable_v<F, int64_t, int64_t, int64_t, int64_t, T*, int64_t>
  GemmEpilogue(F f, bool scratch = false) : fn(std::move(f)), scratch(scratch) {}  // NOLINT: a lambda converts
  explicit operator bool() const { return static_cast<bool>(fn); }
};

// A row that every row of C starts from in place of zero (a bias, n values): each element's
// chain of multiply-adds starts from row[j], as with accumulate onto a C filled with it,
// and the micro-kernels load it as they would load C (filling each block first, or C in a
// pass of its own, was 1-3% of a bf16 gpt-mini step). REQUIRES: accumulate false.
template <typename T>
struct GemmPrologue {
  const T* row = nullptr;

  GemmPrologue() = default;
  explicit GemmPrologue(const T* r) : row(r) {}
  explicit operator bool() const { return row != nullptr; }
  // Rows [0, rows) of a block at `block` (rows ld apart) set to the row's columns [j0, j0 + cols).
  void fill(int64_t rows, int64_t j0, int64_t cols, T* block, int64_t ld) const {
    for (int64_t r = 0; r < rows; ++r) std::copy(row + j0, row + j0 + cols, block + r * ld);
  }
};

// C (m, n) = [C +] op(A) @ op(B), then `epilogue` over C (`prologue`: C = the prologue's row
// in every row + op(A) @ op(B)). op(A) is A (m, k) with row stride
// lda, or A^T where A is (k, m); likewise op(B) (k, n) is B or B^T of a (n, k) B. k == 0
// leaves C (accumulate) or zeroes it. REQUIRES: m, n, k >= 0; leading dimensions at least
// the row length.
template <typename T>
void gemm(bool trans_a,
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
          const GemmEpilogue<T>& epilogue = {},
          const GemmPrologue<T>& prologue = {});

// Loom's GEMM on a chosen f32 path (gemm() uses the one set_gemm_path() chose). REQUIRES: the CPU supports it.
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
              int64_t ldc);

// C (m, n) = [C +] op(A) @ op(B) on 16-bit operands (format kBF16 or kF16), then
// `epilogue` over C; the arguments as gemm's. Each value of A and B is read as the format
// holds it (bf16_operand or f16_operand, kernels/precision.h: round to nearest even; bf16
// reads a subnormal as zero), and each element of C is one chain of f32 fused multiply-adds
// over k in order from C or +0, as gemm's. bf16 chains follow vdpbf16ps: a subnormal C is
// read as zero and every subnormal result written as zero. Every path and thread count
// gives the same bits, those of reference::gemm_half (docs/numerics.md, "16-bit products").
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
               const GemmEpilogue<float>& epilogue = {},
               const GemmPrologue<float>& prologue = {});
// gemm (operands kF32: the values as they are) or gemm_half (operands kBF16 or kF16; T
// float only): a layer's product in its precision.
template <typename T>
void gemm_as(DType operands,
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
             const GemmEpilogue<T>& epilogue = {},
             const GemmPrologue<T>& prologue = {});

// gemm_half on a chosen path. REQUIRES: the CPU supports it.
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
                  int64_t ldc);

// gemm_half with A held in 16-bit storage: `format`'s bits, as store_half writes them (kernels/
// precision.h); B likewise (ValueB uint16_t: a gradient the step keeps in 16 bits, mixed
// precision's MLP) or as f32 values (ValueB float). The bits of gemm_half on the operands'
// f32 values, on every path; vdpbf16ps packs the bits straight into pairs (a weight
// gradient's kept activations, transposed, a 16-bit input's rows, a 16-bit gradient),
// elsewhere they are converted first. Epilogue and prologue as gemm's. Instantiated for
// ValueB float and uint16_t.
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
                    const GemmEpilogue<float>& epilogue = {},
                    const GemmPrologue<float>& prologue = {});

// op(B) (k, n) packed once, as the micro-kernel of the active path reads it for `operands`
// (kF32: the values; kBF16, kF16 with T float: a 16-bit product's), for several products
// that each read a part of it: the attention's keys, values, queries and output gradients,
// per head, where each is otherwise packed again for every block of the other side. pack()
// reuses the storage. The matrix must stay as it was while products read it (the OpenBLAS
// backend reads it in place). One per thread.
template <typename T>
class PackedB {
 public:
  PackedB() = default;
  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;
  // op(B): B (k, n) with row stride ldb, or B^T where B is (n, k) (trans_b).
  void pack(DType operands, bool trans_b, int64_t k, int64_t n, const T* b, int64_t ldb);
  // The same from B held as 16-bit bits of `format` (kBF16 or kF16, the products'
  // operands; T float): the slivers pack() makes of their f32 values, read from half the
  // bytes. Not under the OpenBLAS backend, which reads f32 matrices in place.
  void pack(DType format, bool trans_b, int64_t k, int64_t n, const uint16_t* b, int64_t ldb)
    requires std::is_same_v<T, float>;

 private:
  template <typename V>
  void pack_operand(DType operands, bool trans_b, int64_t k, int64_t n, const V* b, int64_t ldb);
  template <typename U>
  friend void gemm_packed_b(bool, int64_t, int64_t, int64_t, const U*, int64_t, const PackedB<U>&, int64_t, int64_t,
                            bool, U*, int64_t);
  friend void gemm_packed_b(bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const PackedB<float>&, int64_t,
                            int64_t, bool, float*, int64_t);
  DType operands_ = DType::kF32;
  GemmPath path_ = GemmPath::kAuto;  // the path set when it was packed
  bool blas_ = false;                // packed nothing: the OpenBLAS backend reads the matrix
  bool trans_ = false;
  const T* b_ = nullptr;
  int64_t ldb_ = 0, k_ = 0, n_ = 0;
  int64_t stride_ = 0;  // elements of the packed type between slivers
  std::unique_ptr<std::byte, void (*)(void*)> data_{nullptr, &std::free};
  int64_t capacity_ = 0;
};

// C (m, n) = [C +] op(A) @ the part of b's op(B) at rows [p0, p0 + k), columns [j0, j0 + n):
// the bits of gemm_as(b's operands, ...) on that part of the matrix b was packed from.
// REQUIRES: j0 a multiple of 32; p0 even, and k even unless the part ends at b's last row
// (a 16-bit product reads k in pairs); the part inside op(B).
template <typename T>
void gemm_packed_b(bool trans_a,
                   int64_t m,
                   int64_t n,
                   int64_t k,
                   const T* a,
                   int64_t lda,
                   const PackedB<T>& b,
                   int64_t p0,
                   int64_t j0,
                   bool accumulate,
                   T* c,
                   int64_t ldc);
// The same with A held as 16-bit bits of b's operands' format (b packed for a 16-bit
// product): the bits of gemm_packed_b on their f32 values. Not under the OpenBLAS backend.
void gemm_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                   const PackedB<float>& b, int64_t p0, int64_t j0, bool accumulate, float* c, int64_t ldc);

// An f32 op(B) (k, n) laid out once for products that read it many times: a model's
// weights when it serves (nn::Gpt::use_panels). Slivers of 32 columns, each its k rows of
// 32 floats in turn (zeros past n), so a product reads each sliver as one stream; 64-byte
// aligned. docs/numerics.md, "Panels".
struct PanelMatrix {
  int64_t k = 0, n = 0;
  std::shared_ptr<float[]> data;
  int64_t slivers() const { return (n + 31) / 32; }
  int64_t bytes() const { return slivers() * 32 * k * static_cast<int64_t>(sizeof(float)); }
};

// op(B): B (k, n) with row stride ldb, or B^T where B is (n, k) (trans_b).
PanelMatrix pack_panels(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb);
// Column j of op(B) (k values) into out: a tied embedding's row read from the head's panels.
void panel_column(const PanelMatrix& b, int64_t j, float* out);

// C (m, n) = [C +] A (m, k, row stride lda) @ op(B) from its panels, then `epilogue`; the
// bits of gemm(false, trans_b, ...) on the op(B) the panels were made from, on any path and
// thread count. Runs Loom's kernels on the active path whatever the backend.
void gemm_panels(int64_t m, const float* a, int64_t lda, const PanelMatrix& b, bool accumulate, float* c,
                 int64_t ldc, const GemmEpilogue<float>& epilogue = {});

// Whether this CPU (and OS) can run a path; kAuto and kGeneric always can.
bool gemm_path_supported(GemmPath path);
// The path kAuto resolves to on this CPU.
GemmPath gemm_best_path();
// The path kAuto runs 16-bit products on: gemm_best_path(), except that where AVX512_BF16's
// vdpbf16ps is not clearly faster than two FMAs (measured once, on first use) its bf16
// products run on the f32 kernels, which give the same bits (docs/numerics.md).
GemmPath gemm_best_half_path();
const char* gemm_path_name(GemmPath path);
// The path a name (as gemm_path_name writes it) stands for; InputError for any other name.
GemmPath gemm_path_named(const std::string& name);
// All paths this CPU supports that give the one set of bits (reference::gemm and
// gemm_half's), widest first: never kAuto, nor kAmx (check gemm_path_supported).
std::vector<GemmPath> gemm_supported_paths();

// The core's FMA peak (GFLOP/s) on a path's instruction set at `threads` threads: register-
// only FMA chains timed for at least `seconds`. For benchmarks (loom bench gemm).
double fma_peak_gflops(GemmPath path, int threads, double seconds = 0.2);
// The same for vdpbf16ps (each 32 multiply-adds). REQUIRES: gemm_path_supported(kAvx512Bf16).
double bf16_peak_gflops(int threads, double seconds = 0.2);
// The peak of the instruction a path's bf16 products run on: tdpbf16ps (tiles) on kAmx,
// vdpbf16ps on kAvx512Bf16, the FMA's elsewhere.
double half_peak_gflops(GemmPath path, int threads, double seconds = 0.2);

// Process-wide selection. set_gemm_path throws loom::Error (naming the path and the CPU's
// missing feature) when the CPU does not support it.
void set_gemm_path(GemmPath path);
// The path gemm() runs f32 products on now: the set one, kAuto resolved for this CPU.
GemmPath gemm_active_path();
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_active_backend();

// Whether a product whose tiles are bands of rows by every column (each needing all of
// op(B)), or of columns by every row (all of op(A)), packs that operand once, each thread a
// share, rather than once per tile: kAuto does from 4 threads on (at 2 it measured no
// faster). The bits are the same either way. Process-wide, for benchmarks (`loom bench
// train --shared-pack`, `loom bench gemm --shared-pack`).
enum class GemmSharedPack { kAuto, kOn, kOff };
void set_gemm_shared_pack(GemmSharedPack mode);
GemmSharedPack gemm_shared_pack();

}  // namespace loom::kernels
