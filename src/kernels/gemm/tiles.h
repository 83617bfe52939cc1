// Loom's GEMM driver: output tiles across threads, each tile's packing, and the micro-kernel
// calls; operands a tile shares with every other packed once for all of them. Internal to
// src/kernels/gemm/ (gemm.cc's products run through gemm_packed). See gemm.h for the contract
// and the order of arithmetic, microkernel.h for the micro-kernel contract.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/packing.h"
#include "loom/core/error.h"

namespace loom::kernels::gemm_detail {

// Whether a product on `threads` threads packs an operand every tile needs once for all of
// them (set_gemm_shared_pack's mode; gemm.cc).
bool shares_packing(int threads);

// Per-thread packing space, 64-byte aligned (the kernels' aligned loads need it), grown on
// demand and kept for the thread's life.
template <typename T>
T* scratch(int slot, int64_t count) {
  struct Buffer {
    std::unique_ptr<T, decltype(&std::free)> data{nullptr, &std::free};
    int64_t capacity = 0;
  };
  thread_local Buffer buffers[5];  // packed A, packed B, an epilogue's block, a shared op(A) or op(B), a shared op(B)
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


// Where a panel's NR-column slivers of op(B) are: the first, and the distance between two.
template <typename P>
struct Slivers {
  const P* p;
  int64_t stride;
};

// op(B) packed beforehand (PackedB): slivers `stride` apart, each zero-padded past n; p is
// the product's first column's sliver at the product's first k.
template <typename P>
struct Prepacked {
  const P* p;  // the first sliver of the product's first column
  int64_t stride;
  static constexpr bool trans = false;  // nothing to pack: tiles need not be tall (gemm_packed)
};

// The slivers of op(B)(p0 .. p0+kc, j0 .. j0+cols): packed into `scratch` now, or where a
// Prepacked op(B) holds them (j0 a multiple of NR, p0 of Packing::kStep).
template <typename Packing, typename OperandB, typename P>
Slivers<P> b_slivers(const Packing& packing, const OperandB& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols,
                     int nr, P* scratch) {
  packing.b(b, p0, kc, j0, cols, nr, scratch);
  return {scratch, ceil_div(kc, Packing::kStep) * nr};
}
template <typename Packing, typename P>
Slivers<P> b_slivers(const Packing&, const Prepacked<P>& b, int64_t p0, int64_t, int64_t j0, int64_t, int nr, P*) {
  return {b.p + (j0 / nr) * b.stride + (p0 / Packing::kStep) * nr, b.stride};
}

// One output tile, rows [i0, i0 + rows) x columns [j0, j0 + cols), over all of k. Per KC
// block, the tile's rows of op(A) are packed once into MR-row slivers (or, with shared_a,
// were packed already for all of k, rows [0, shared_rows) of op(A): block after block, each
// block's slivers a_stride apart, the blocks ceil(shared_rows / MR) KC-deep slivers apart;
// i0 then a multiple of MR); then per NC-wide panel of op(B) (packed, meant to stay in L2)
// every A sliver meets every B sliver.
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
              const GemmEpilogue<T>& epilogue,
              const GemmPrologue<T>& prologue,
              const typename Packing::P* shared_a = nullptr,
              int64_t shared_rows = 0) {
  using P = typename Packing::P;
  const int mr = mk.mr, nr = mk.nr;
  const auto depth_of = [](int64_t kc) { return (kc + Packing::kStep - 1) / Packing::kStep; };
  P* packed_a =
      shared_a != nullptr ? nullptr : scratch<P>(0, Packing::a_stride(depth_of(mk.kc), mr) * ceil_div(rows, mr));
  P* packed_b = scratch<P>(1, depth_of(mk.kc) * round_up(std::min(cols, mk.nc), nr));
  // A scratch epilogue's blocks, where the product passes over k once: each sliver's block
  // of a panel in `block` (MR x NC, in L1), C untouched.
  const bool in_block = epilogue.scratch && !accumulate && k <= mk.kc;
  const int64_t ld_block = round_up(std::min(cols, mk.nc), nr);
  T* block = in_block ? scratch<T>(2, mr * ld_block) : nullptr;
  alignas(64) T edge[32 * 32];  // one partial MR x NR block (every kernel has MR, NR <= 32)
  {
    const FlushSubnormals flush(packing.flush);
    for (int64_t p0 = 0; p0 < k; p0 += mk.kc) {
      const int64_t kc = std::min(mk.kc, k - p0), depth = depth_of(kc);
      const bool acc = accumulate || p0 > 0;  // later blocks continue each element's chain
      const bool start = p0 == 0 && prologue;  // or each chain starts from the prologue's row
      const bool last = p0 + kc >= k;         // this block's multiply-adds are each element's last
      const int64_t a_stride = Packing::a_stride(depth, mr);
      const P* block_a = packed_a;
      if (shared_a != nullptr)  // every block before this one is KC deep
        block_a = shared_a + (p0 / mk.kc) * ceil_div(shared_rows, mr) * Packing::a_stride(depth_of(mk.kc), mr) +
                  (i0 / mr) * a_stride;
      else
        packing.a(a, i0, rows, p0, kc, mr, packed_a, a_stride);  // every MR-row sliver, sliver s at s * a_stride
      for (int64_t jc = 0; jc < cols; jc += mk.nc) {
        const int64_t panel = std::min(mk.nc, cols - jc);
        const Slivers<P> bs = b_slivers(packing, b, p0, kc, j0 + jc, panel, nr, packed_b);
        for (int64_t ir = 0; ir < rows; ir += mr) {
          const int64_t h = std::min<int64_t>(mr, rows - ir);
          const P* pa = block_a + (ir / mr) * a_stride;
          T* cs = in_block ? block : c + (i0 + ir) * ldc + j0 + jc;  // the sliver's rows of this panel
          const int64_t lds = in_block ? ld_block : ldc;
          for (int64_t jr = 0; jr < panel; jr += nr) {
            const int64_t w = std::min<int64_t>(nr, panel - jr);
            const P* pb = bs.p + (jr / nr) * bs.stride;
            T* ct = cs + jr;
            // Where the block's chains start: its own C, the prologue's row (every row alike), or +0.
            const T* from = acc ? ct : start ? prologue.row + j0 + jc + jr : nullptr;
            const int64_t ld_from = acc ? lds : 0;
            if (h == mr && w == nr) {
              mk.fn(depth, pa, pb, ct, lds, from, ld_from);
              continue;
            }
            // Partial block: on a copy, by the kernel of the fewest rows that hold it (the same
            // chains); padded rows and lanes are discarded.
            const auto fn = h <= 4 && mk.fn4 != nullptr ? mk.fn4 : h <= 8 && mk.fn8 != nullptr ? mk.fn8 : mk.fn;
            if (from != nullptr)
              for (int64_t r = 0; r < h; ++r) std::memcpy(edge + r * nr, from + r * ld_from, w * sizeof(T));
            fn(depth, pa, pb, edge, nr, from != nullptr ? edge : nullptr, nr);
            for (int64_t r = 0; r < h; ++r) std::memcpy(ct + r * lds, edge + r * nr, w * sizeof(T));
          }
          // The sliver's MR rows of this panel are final: the epilogue takes them while they
          // are in L1 (12 KiB for bf16's 12 x 256), where the whole tile (up to 1032 rows by
          // every column, megabytes) would have left the cache; with the caller's MXCSR.
          if (epilogue && last) {
            flush.suspend();
            epilogue.fn(i0 + ir, h, j0 + jc, panel, cs, lds);
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
inline int product_threads(int64_t m, int64_t n, int64_t k) {
  const bool parallel = omp_get_level() == 0 && m * n * k >= kParallelMinWork;
  return parallel ? omp_get_max_threads() : 1;
}

// C (m x n) [+]= op(A) op(B) on one thread with op(A) read in place (MicroKernel::direct)
// and op(B) prepacked over all of k: each MR-row sliver of A, in L1 after its first use,
// meets every sliver of B in turn, over all k at once (each element's chain in k order, as
// run_tile's blocks of k continue it through C: the same bits). A last sliver of fewer rows
// runs on exactly those rows; a last sliver of B narrower than NR on a copy of C's columns.
template <typename P>
void direct_a_product(const MicroKernel<P, float>& mk, bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const Prepacked<P>& b, bool accumulate, float* c, int64_t ldc) {
  const int mr = mk.mr, nr = mk.nr;
  alignas(64) float edge[32 * 32];  // one partial MR x NR block (every kernel has MR, NR <= 32)
  for (int64_t i = 0; i < m; i += mr) {
    const int rows = static_cast<int>(std::min<int64_t>(mr, m - i));
    const float* ai = trans_a ? a + i : a + i * lda;
    for (int64_t j = 0; j < n; j += nr) {
      const P* pb = b.p + (j / nr) * b.stride;
      float* ct = c + i * ldc + j;
      const int64_t w = std::min<int64_t>(nr, n - j);
      if (w == nr) {
        mk.direct(rows, trans_a, k, ai, lda, pb, ct, ldc, accumulate ? ct : nullptr, ldc);
        continue;
      }
      if (accumulate)
        for (int r = 0; r < rows; ++r) std::memcpy(edge + r * nr, ct + r * ldc, w * sizeof(float));
      mk.direct(rows, trans_a, k, ai, lda, pb, edge, nr, accumulate ? edge : nullptr, nr);
      for (int r = 0; r < rows; ++r) std::memcpy(ct + r * ldc, edge + r * nr, w * sizeof(float));
    }
  }
}

// Where a product does not run by packed tiles: the prologue over all of C first, which
// the product then accumulates onto.
template <typename T>
void start_whole(const GemmPrologue<T>& prologue, int64_t m, int64_t n, T* c, int64_t ldc, bool& accumulate) {
  LOOM_CHECK(!(prologue && accumulate));
  if (!prologue || m == 0 || n == 0) return;
  prologue.fill(m, 0, n, c, ldc);
  accumulate = true;
}

// k == 0 (or an empty C): C kept (accumulate), the prologue's or zeroed, then the epilogue.
// True when the product is done.
template <typename T>
bool trivial_product(int64_t m, int64_t n, int64_t k, bool accumulate, T* c, int64_t ldc,
                     const GemmEpilogue<T>& epilogue, const GemmPrologue<T>& prologue) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  start_whole(prologue, m, n, c, ldc, accumulate);
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  if (epilogue) epilogue.fn(0, m, 0, n, c, ldc);
  return true;
}

// An operand packed once for every tile of a product on `threads` threads, in the calling
// thread's scratch (op(A) in slot 3; op(B) in `slot`: 3 where it is the one shared, 4
// beside a shared op(A)), kept from call to call. op(A): block after
// block of KC of k, each block's MR-row slivers as run_tile's shared_a reads them. op(B):
// each NR-column sliver over all of k, `stride` apart, as a Prepacked op(B) is read. The
// pack_* functions are called by every thread of a parallel region, each packing its share
// (an orphaned `omp for`, no barrier after it: the caller puts one before the tiles read).
template <typename Packing, typename T>
typename Packing::P* shared_a_space(const MicroKernel<typename Packing::P, T>& mk, int64_t m, int64_t k) {
  const int64_t block = ceil_div(m, mk.mr) * Packing::a_stride(ceil_div(mk.kc, Packing::kStep), mk.mr);
  return scratch<typename Packing::P>(3, ceil_div(k, mk.kc) * block);
}
template <typename Packing, typename T>
Prepacked<typename Packing::P> shared_b_space(const MicroKernel<typename Packing::P, T>& mk, int64_t n, int64_t k,
                                              int slot) {
  const int64_t stride = ceil_div(k, Packing::kStep) * mk.nr;
  return {scratch<typename Packing::P>(slot, ceil_div(n, mk.nr) * stride), stride};
}
template <typename Packing, typename T, typename OperandA>
void pack_shared_a(const MicroKernel<typename Packing::P, T>& mk, const Packing& packing, const OperandA& oa,
                   int64_t m, int64_t k, int threads, typename Packing::P* shared) {
  const auto depth_of = [](int64_t kc) { return ceil_div(kc, Packing::kStep); };
  const int64_t block = ceil_div(m, mk.mr) * Packing::a_stride(depth_of(mk.kc), mk.mr), blocks = ceil_div(k, mk.kc);
  const int64_t share = round_up(ceil_div(m, threads), mk.mr), shares = ceil_div(m, share);
#pragma omp for schedule(static) nowait
  for (int64_t task = 0; task < blocks * shares; ++task) {
    const FlushSubnormals flush(packing.flush);
    const int64_t p0 = (task / shares) * mk.kc, kc = std::min(mk.kc, k - p0), r0 = (task % shares) * share;
    const int64_t stride = Packing::a_stride(depth_of(kc), mk.mr);
    packing.a(oa, r0, std::min(share, m - r0), p0, kc, mk.mr, shared + (p0 / mk.kc) * block + (r0 / mk.mr) * stride,
              stride);
  }
}
template <typename Packing, typename T, typename OperandB>
void pack_shared_b(const MicroKernel<typename Packing::P, T>& mk, const Packing& packing, const OperandB& ob,
                   int64_t n, int64_t k, int threads, const Prepacked<typename Packing::P>& shared) {
  const int64_t slivers = ceil_div(n, mk.nr), share = ceil_div(slivers, threads);
  auto* out = const_cast<typename Packing::P*>(shared.p);
#pragma omp for schedule(static) nowait
  for (int64_t s0 = 0; s0 < slivers; s0 += share) {
    const FlushSubnormals flush(packing.flush);
    const int64_t j0 = s0 * mk.nr;
    packing.b(ob, 0, k, j0, std::min(share * mk.nr, n - j0), mk.nr, out + s0 * shared.stride);
  }
}

// How gemm_packed cuts C (m x n) for `threads` threads. Bands: tiles of mc rows by nc
// columns, row after row of tiles_n, handed out by schedule(static). Tiles start as MC rows
// (mc_wide where op(B) spans several panels or is transposed) by every column (A is then
// packed once per KC block). With several threads the tile count is raised to a multiple of
// the thread count, so no thread idles at the end. A cut across rows repacks op(B) once
// more (n x k), a cut across columns op(A) (m x k): the cheaper one goes first, while tiles
// keep at least 2 MR rows and NR columns. Rounding the tiles up to whole slivers can leave
// fewer tiles than threads, or some threads two where others have one: gpt-mini's qkv weight
// gradient (256 x 768) on 16 threads is 12 column bands of 64, a third over the 48 an even
// split gives. Where op(A) and op(B) are each packed once for all threads (shares_packing),
// a grid of grid_m x grid_n tiles, one a thread, the rows' MR-slivers and the columns'
// NR-slivers dealt out as evenly as they go, is taken instead when its largest tile is under
// 0.95 of the bands' largest load: no tile packs anything itself then, so the grid's cuts
// cost nothing. `load`: the most MR x NR blocks' elements one thread computes.
struct TilePlan {
  int64_t mc = 0, nc = 0, tiles_n = 0, tiles = 0;
  int64_t grid_m = 0, grid_n = 0;  // the grid's shape, 0 for bands
  int64_t load = 0;
};

// The first row (column) of part `i` of `parts` when `slivers` slivers of `width` go as
// evenly as they can (their counts differ by one at most).
inline int64_t grid_edge(int64_t i, int64_t parts, int64_t slivers, int64_t width) {
  return i * slivers / parts * width;
}

inline constexpr int64_t kGridMaxPacked = int64_t{16} << 20;  // elements of op(A) and op(B) together

template <typename P, typename T>
TilePlan plan_tiles(const MicroKernel<P, T>& mk, int64_t m, int64_t n, int64_t k, bool b_wide, bool b_prepacked,
                    int threads) {
  int64_t tm = ceil_div(m, n > mk.nc || b_wide ? mk.mc_wide : mk.mc), tn = 1;
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
  TilePlan plan;
  plan.mc = round_up(ceil_div(m, tm), mk.mr), plan.nc = round_up(ceil_div(n, tn), mk.nr);
  plan.tiles_n = ceil_div(n, plan.nc), plan.tiles = ceil_div(m, plan.mc) * plan.tiles_n;
  // schedule(static) gives the first tiles % threads threads one tile more, each a run.
  const int64_t per = plan.tiles / threads, extra = plan.tiles % threads;
  for (int64_t th = 0, t = 0; th < threads && t < plan.tiles; ++th) {
    int64_t load = 0;
    for (const int64_t end = t + per + (th < extra ? 1 : 0); t < end; ++t) {
      const int64_t i0 = (t / plan.tiles_n) * plan.mc, j0 = (t % plan.tiles_n) * plan.nc;
      load += round_up(std::min(plan.mc, m - i0), mk.mr) * round_up(std::min(plan.nc, n - j0), mk.nr);
    }
    plan.load = std::max(plan.load, load);
  }
  // Both packs stay in the calling thread's scratch: the grid is for products whose
  // operands pack into 64 MiB (gpt2-124m's head input gradient, k = 50,257, would take 360).
  if (threads < 2 || b_prepacked || !shares_packing(threads) || (m + n) * k > kGridMaxPacked) return plan;
  const int64_t row_slivers = ceil_div(m, mk.mr), col_slivers = ceil_div(n, mk.nr);
  int64_t best = 0, best_m = 0;
  for (int64_t gm = 1; gm <= threads; ++gm) {
    const int64_t gn = threads / gm;
    if (threads % gm != 0 || gm > row_slivers || gn > col_slivers) continue;
    const int64_t load = ceil_div(row_slivers, gm) * mk.mr * ceil_div(col_slivers, gn) * mk.nr;
    if (best_m == 0 || load < best) best = load, best_m = gm;
  }
  if (best_m != 0 && 100 * best < 95 * plan.load) {
    plan.grid_m = best_m, plan.grid_n = threads / best_m;
    plan.load = best;
  }
  return plan;
}

// Cuts C into tiles (multiples of MR rows and NR columns, plan_tiles) and hands whole tiles
// to threads; no split touches k, so the bits do not depend on the thread count.
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
                 const GemmEpilogue<T>& epilogue,
                 const GemmPrologue<T>& prologue = {}) {
  LOOM_CHECK(!(prologue && accumulate));
  using P = typename Packing::P;
  constexpr bool kPrepacked = std::is_same_v<OperandB, Prepacked<P>>;
  const TilePlan plan = plan_tiles(mk, m, n, k, ob.trans, kPrepacked, threads);
  if constexpr (!kPrepacked) {
    if (plan.grid_m != 0) {
      // The grid: op(A) and op(B) each packed once, each thread a share (as the bands below
      // pack them); then each thread its tile, read from both.
      P* shared_a = shared_a_space<Packing>(mk, m, k);
      const Prepacked<P> packed = shared_b_space<Packing>(mk, n, k, 4);
      const int64_t row_slivers = ceil_div(m, mk.mr), slivers = ceil_div(n, mk.nr), grid_n = plan.grid_n;
#pragma omp parallel num_threads(threads)
      {
        pack_shared_a(mk, packing, oa, m, k, threads, shared_a);
        pack_shared_b(mk, packing, ob, n, k, threads, packed);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t t = 0; t < plan.grid_m * grid_n; ++t) {
          const int64_t gi = t / grid_n, gj = t % grid_n;
          const int64_t i0 = grid_edge(gi, plan.grid_m, row_slivers, mk.mr);
          const int64_t i1 = std::min(m, grid_edge(gi + 1, plan.grid_m, row_slivers, mk.mr));
          const int64_t j0 = grid_edge(gj, grid_n, slivers, mk.nr);
          const int64_t j1 = std::min(n, grid_edge(gj + 1, grid_n, slivers, mk.nr));
          run_tile(mk, packing, oa, packed, k, accumulate, c, ldc, i0, i1 - i0, j0, j1 - j0, epilogue, prologue,
                   static_cast<const P*>(shared_a), m);
        }
      }
      return;
    }
  }
  const int64_t mc = plan.mc, nc = plan.nc, tiles_n = plan.tiles_n, tiles = plan.tiles;
  const auto tile = [&](int64_t t) {
    const int64_t i0 = (t / tiles_n) * mc, j0 = (t % tiles_n) * nc;
    run_tile(mk, packing, oa, ob, k, accumulate, c, ldc, i0, std::min(mc, m - i0), j0, std::min(nc, n - j0), epilogue,
             prologue);
  };
  if (tiles_n == tiles && tiles > 1 && shares_packing(threads)) {
    // Every tile is a band of columns by every row, so each would pack all of op(A): it is
    // packed once instead, each thread a share of the rows (whole slivers), as run_tile's
    // shared_a reads it.
    P* shared = shared_a_space<Packing>(mk, m, k);
#pragma omp parallel num_threads(threads)
    {
      pack_shared_a(mk, packing, oa, m, k, threads, shared);
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t j0 = t * nc;
        run_tile(mk, packing, oa, ob, k, accumulate, c, ldc, 0, m, j0, std::min(nc, n - j0), epilogue, prologue,
                 static_cast<const P*>(shared), m);
      }
    }
    return;
  }
  if constexpr (!kPrepacked) {
    if (tiles_n == 1 && tiles > 1 && shares_packing(threads)) {
      // Every tile is a band of rows by every column, so each would pack all of op(B): it
      // is packed once instead, over all of k, each thread a share of its NR-column slivers
      // (the values are the same whoever packs them, so are the bits), then the tiles read it
      // as PackedB's products do.
      const Prepacked<P> packed = shared_b_space<Packing>(mk, n, k, 3);
#pragma omp parallel num_threads(threads)
      {
        pack_shared_b(mk, packing, ob, n, k, threads, packed);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t i0 = t * mc;
          run_tile(mk, packing, oa, packed, k, accumulate, c, ldc, i0, std::min(mc, m - i0), 0, n, epilogue, prologue);
        }
      }
      return;
    }
  }
  if (threads == 1) {
    for (int64_t t = 0; t < tiles; ++t) tile(t);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tiles; ++t) tile(t);
}

}  // namespace loom::kernels::gemm_detail
