// Causal self-attention on tensor cores with the scores in registers (docs/gpu.md,
// "Attention"): FlashAttention-2's layout on `mma.sync.m16n8k16` (sm_80 and later). A CUDA
// block of 4 warps takes 64 rows, each warp 16; a warp's scores against 64 keys are the
// accumulators of its products and become, rounded to bf16, the A operand of the next
// product without going through shared memory (an m16n8 accumulator pair has the m16k16
// A fragment's layout). Only the tiles of q, k, v and dy pass through shared memory, copied
// there by cp.async a block ahead of the products that read them (two buffers each).
//
// The same computation as attention.cu's WMMA kernels, in the same roundings: f32
// accumulation, probabilities rounded to bf16 before they multiply v, dS rounded to bf16
// before it multiplies q and k; sums in another (fixed) order. Backward is two kernels, so
// nothing is added with atomics: dk and dv by key blocks, dq by query blocks.
//
// Fragments (PTX ISA, "mma.m16n8k16"): lane l, g = l / 4, i = l % 4. A (16 x 16, row):
// a0 (g, 2i..2i+1), a1 (g + 8, 2i..), a2 (g, 2i + 8..), a3 (g + 8, 2i + 8..); B (16 x 8,
// col): b0 (k 2i..2i+1, n g), b1 (k 2i + 8.., n g); C (16 x 8): c0, c1 (g, 2i..2i+1),
// c2, c3 (g + 8, 2i..). Two bf16 in a register: the lower index in the low half.
#include <cuda_bf16.h>

#include "gpu/attention_tiles.cuh"
#include "gpu/kernels.h"

namespace loom::gpu::kern {
namespace {

using nvbf = __nv_bfloat16;
using tiles::kRows;
using tiles::kThreads;

// Keys (or queries) per pass of the backward kernels: half a block, so that the scores and
// their gradients of one pass take 32 registers a lane.
constexpr int kHalf = kRows / 2;

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// d += a b, bf16 operands, f32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t load32(const nvbf* p) { return *reinterpret_cast<const uint32_t*>(p); }

// round_bf16(lo) in the low half, round_bf16(hi) in the high half.
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A fragment of rows r0.. and columns k0.. of a row-major tile (rows LD elements apart).
template <int LD>
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const nvbf* tile, int r0, int k0) {
  const int lane = lane_id();
  const nvbf* p = tile + (r0 + lane / 4) * LD + k0 + 2 * (lane % 4);
  a[0] = load32(p);
  a[1] = load32(p + 8 * LD);
  a[2] = load32(p + 8);
  a[3] = load32(p + 8 * LD + 8);
}

// B fragment whose columns n0.. are the tile's rows n0.. and rows k0.. its columns k0..
// (B = tileᵀ: scores q kᵀ read k this way).
template <int LD>
__device__ __forceinline__ void frag_b_rows(uint32_t& b0, uint32_t& b1, const nvbf* tile, int n0, int k0) {
  const int lane = lane_id();
  const nvbf* p = tile + (n0 + lane / 4) * LD + k0 + 2 * (lane % 4);
  b0 = load32(p);
  b1 = load32(p + 8);
}

// frag_b_rows for two column groups at once, by one ldmatrix (no .trans): b[0], b[1] for the
// tile's rows n0..n0+7, b[2], b[3] for n0 + 8..; lane l gives the address of row l % 8 of
// 8 x 8 matrix l / 8, the matrices at (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8).
// Each register holds what frag_b_rows's loads give, so the products are the same; one
// instruction where four 32-bit loads were.
template <int LD>
__device__ __forceinline__ void frag_b_rows_x4(uint32_t (&b)[4], const nvbf* tile, int n0, int k0) {
  const int lane = lane_id(), m = lane / 8;
  const nvbf* p = tile + (n0 + (m / 2) * 8 + lane % 8) * LD + k0 + (m % 2) * 8;
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
}

// B fragments of two column groups, B = the tile's rows k0..k0+15 and columns n0..n0+15:
// b[0], b[1] for columns n0.., b[2], b[3] for n0 + 8.. (p v reads v this way). ldmatrix
// with .trans: lane l gives the address of row l % 8 of 8 x 8 matrix l / 8.
template <int LD>
__device__ __forceinline__ void frag_b_cols(uint32_t (&b)[4], const nvbf* tile, int k0, int n0) {
  const int lane = lane_id(), m = lane / 8;
  const nvbf* p = tile + (k0 + (m % 2) * 8 + lane % 8) * LD + n0 + (m / 2) * 8;
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
}

// acc (16 x 8 N) += a (16 x 16 K, A fragments) times the tile's rows k0.. (K of them) and
// columns 0..8 N: the product whose B is read along its rows (p v, dS q, dS k).
template <int LD, int K16, int N8>
__device__ __forceinline__ void product_rows(float (&acc)[N8][4], const uint32_t (&a)[K16][4], const nvbf* tile,
                                             int k0) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk)
#pragma unroll
    for (int n = 0; n < N8; n += 2) {
      uint32_t b[4];
      frag_b_cols<LD>(b, tile, k0 + kk * 16, n * 8);
      mma(acc[n], a[kk], b[0], b[1]);
      mma(acc[n + 1], a[kk], b[2], b[3]);
    }
}

// s (16 x 8 N) = a (16 x HS) times the tile's rows n0.. (N of them) transposed: scores.
// X4: two column groups' fragments a ldmatrix (frag_b_rows_x4); each accumulator gets the
// same multiply-adds in the same order either way.
template <int LD, int HS, bool X4, int N8>
__device__ __forceinline__ void product_scores(float (&s)[N8][4], const uint32_t (&a)[HS / 16][4], const nvbf* tile,
                                               int n0) {
  if constexpr (X4) {
    static_assert(N8 % 2 == 0);
#pragma unroll
    for (int n = 0; n < N8; n += 2) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      s[n + 1][0] = s[n + 1][1] = s[n + 1][2] = s[n + 1][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        uint32_t b[4];
        frag_b_rows_x4<LD>(b, tile, n0 + n * 8, kk * 16);
        mma(s[n], a[kk], b[0], b[1]);
        mma(s[n + 1], a[kk], b[2], b[3]);
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < N8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        uint32_t b0, b1;
        frag_b_rows<LD>(b0, b1, tile, n0 + n * 8, kk * 16);
        mma(s[n], a[kk], b0, b1);
      }
    }
  }
}

// Accumulators (16 x 8 N, f32) as the A fragments (16 x 16 N/2) of the next product, rounded.
template <int N8>
__device__ __forceinline__ void to_a(uint32_t (&a)[N8 / 2][4], const float (&c)[N8][4]) {
#pragma unroll
  for (int n = 0; n < N8; ++n) {
    a[n / 2][(n % 2) * 2] = pack(c[n][0], c[n][1]);
    a[n / 2][(n % 2) * 2 + 1] = pack(c[n][2], c[n][3]);
  }
}

// A warp's 16 rows of HS accumulators (times row_scale[0] for the first 8, [1] the next 8)
// as bf16 to rows r0.. of dst (rows ld apart, from column col); rows at or past T skipped.
template <int HS>
__device__ void store_rows(nvbf* dst, int64_t ld, int64_t col, int r0, int t, const float (&acc)[HS / 8][4],
                           const float (&row_scale)[2]) {
  const int lane = lane_id();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + lane / 4 + 8 * r;
    if (row >= t) continue;
    nvbf* out = dst + int64_t{row} * ld + col + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < HS / 8; ++n)
      *reinterpret_cast<uint32_t*>(out + n * 8) = pack(acc[n][2 * r] * row_scale[r], acc[n][2 * r + 1] * row_scale[r]);
  }
}

// cp.async (sm_80): 16 bytes (4 for a row statistic) from global to shared memory without
// passing through registers, so the next block's tiles load while this block's multiply;
// `valid` false writes zeros (nothing is read, the address is only formed).
__device__ __forceinline__ void copy_async16(void* dst, const void* src, bool valid) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async4(void* dst, const void* src, bool valid) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's groups of copies are still in flight.
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// tiles::load_tile's rows, started with cp.async (rows at or past T zero-filled).
template <int HS>
__device__ void start_tile(nvbf* tile, const nvbf* base, int64_t ld, int64_t col, int r0, int t) {
  constexpr int kVecs = HS / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kVecs; i += kThreads) {
    const int r = i / kVecs, d = (i % kVecs) * 8;
    const bool valid = r0 + r < t;
    copy_async16(tile + r * tiles::kLd<HS> + d, valid ? base + int64_t{r0 + r} * ld + col + d : base, valid);
  }
}

// Head h's keys and values of rows [k0, k0 + 64) started into two tiles, as one group.
template <int HS>
__device__ void start_keys_values(nvbf* ks, nvbf* vs, const nvbf* base, int64_t ld, int c, int h, int k0, int t) {
  start_tile<HS>(ks, base, ld, c + int64_t{h} * HS, k0, t);
  start_tile<HS>(vs, base, ld, 2 * int64_t{c} + int64_t{h} * HS, k0, t);
  commit_copies();
}

// The loops over blocks double-buffer: turn i starts block i + 1's copies into buffer
// (i + 1) % 2 (none past the last block), waits for block i's and meets the other warps,
// multiplies from buffer i % 2, and meets them again before turn i + 1 overwrites it.
__device__ __forceinline__ void wait_for_current(bool started_next) {
  if (started_next)
    wait_copies<1>();
  else
    wait_copies<0>();
  __syncthreads();
}

// A warp's 16 rows of a (64, HS) tile as A fragments, through shared memory.
template <int HS>
__device__ __forceinline__ void rows_to_a(uint32_t (&a)[HS / 16][4], const nvbf* tile, int r0) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) frag_a<tiles::kLd<HS>>(a[kk], tile, r0, kk * 16);
}

template <int HS, bool X4>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(nvbf* y, float* lse, const nvbf* qkv, int t, int c, int nh, float scale) {
  constexpr int LD = tiles::kLd<HS>;
  __shared__ __align__(128) nvbf qs[kRows * LD], ks[2][kRows * LD], vs[2][kRows * LD];
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // the blocks with the most keys first
  const int bh = static_cast<int>(blockIdx.y), b = bh / nh, h = bh % nh, q0 = qb * kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = lane_id();
  const int row0 = q0 + warp * 16 + lane / 4;  // this lane's rows: row0 and row0 + 8
  const auto start_keys = [&](int kb) { start_keys_values<HS>(ks[kb % 2], vs[kb % 2], base, ld, c, h, kb * kRows, t); };

  start_keys(0);
  tiles::load_tile<HS>(qs, base, ld, int64_t{h} * HS, q0, t);
  __syncthreads();
  uint32_t qf[HS / 16][4];
  rows_to_a<HS>(qf, qs, warp * 16);
  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * kRows;
    if (kb < qb) start_keys(kb + 1);
    wait_for_current(kb < qb);
    const nvbf* kt = ks[kb % 2];
    const nvbf* vt = vs[kb % 2];
    float s[kRows / 8][4];
    product_scores<LD, HS, X4>(s, qf, kt, 0);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + 8 * (e / 2), key = k0 + n * 8 + 2 * (lane % 4) + e % 2;
        s[n][e] = key <= row && key < t ? s[n][e] * scale : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the four lanes of a row
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // key k0 <= q0 <= row is always allowed: finite
      alpha[r] = __expf(m[r] - m_new);
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = __expf(s[n][e] - m[e / 2]);
        sum[e / 2] += s[n][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];  // this lane's columns' share
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    uint32_t pf[kRows / 16][4];
    to_a(pf, s);
    product_rows<LD>(o, pf, vt, 0);
    __syncthreads();  // turn kb + 1 starts overwriting these buffers
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.0f / l[r];
    const int row = row0 + 8 * r;
    if (lane % 4 == 0 && row < t) lse[int64_t{bh} * t + row] = m[r] + logf(l[r]);
  }
  store_rows<HS>(y + int64_t{b} * t * c, c, int64_t{h} * HS, q0 + warp * 16, t, o, inv);
}

// Per key block: dk and dv over the query blocks that see it. A warp holds its 16 keys' k
// and v as A fragments and computes sᵀ = k qᵀ and dpᵀ = v dyᵀ, 32 queries a pass.
// X4 (kMmaX4) holds it to 168 registers, three blocks an SM (a few bytes spill); kMma's
// 197 allow two. A minimum of 0 blocks is none given: kMma's code is what it was without.
template <int HS, bool X4>
__global__ void __launch_bounds__(kThreads, X4 ? 3 : 0)
    dkv_kernel(nvbf* dqkv, const nvbf* dy, const nvbf* qkv, const float* lse, const float* dpre, int t, int c, int nh,
               float scale) {
  constexpr int LD = tiles::kLd<HS>;
  __shared__ __align__(128) nvbf q_buf[2][kRows * LD], do_buf[2][kRows * LD];
  __shared__ float lse_buf[2][kRows], dpre_buf[2][kRows];
  const int kb = static_cast<int>(blockIdx.x), bh = static_cast<int>(blockIdx.y), b = bh / nh, h = bh % nh;
  const int k0 = kb * kRows, n_blocks = (t + kRows - 1) / kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const nvbf* dbase = dy + int64_t{b} * t * c;
  const float* lse_h = lse + int64_t{bh} * t;
  const float* dpre_h = dpre + int64_t{bh} * t;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = lane_id();
  const int key0 = k0 + warp * 16 + lane / 4;  // this lane's keys: key0 and key0 + 8
  const auto start_queries = [&](int qb, int buf) {
    const int q0 = qb * kRows;
    start_tile<HS>(q_buf[buf], base, ld, int64_t{h} * HS, q0, t);
    start_tile<HS>(do_buf[buf], dbase, c, int64_t{h} * HS, q0, t);
    for (int i = static_cast<int>(threadIdx.x); i < kRows; i += kThreads) {
      const bool valid = q0 + i < t;  // 0 past T
      copy_async4(&lse_buf[buf][i], valid ? lse_h + q0 + i : lse_h, valid);
      copy_async4(&dpre_buf[buf][i], valid ? dpre_h + q0 + i : dpre_h, valid);
    }
    commit_copies();
  };

  tiles::load_keys_values<HS>(q_buf[1], do_buf[1], base, ld, c, h, k0, t);  // buffer 1 lent to k and v
  __syncthreads();
  uint32_t kf[HS / 16][4], vf[HS / 16][4];
  rows_to_a<HS>(kf, q_buf[1], warp * 16);
  rows_to_a<HS>(vf, do_buf[1], warp * 16);
  __syncthreads();  // every warp has its fragments before buffer 1 is overwritten
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  start_queries(kb, 0);
  for (int qb = kb; qb < n_blocks; ++qb) {
    const int q0 = qb * kRows, cur = (qb - kb) % 2;
    if (qb + 1 < n_blocks) start_queries(qb + 1, 1 - cur);
    wait_for_current(qb + 1 < n_blocks);
    const nvbf* qs = q_buf[cur];
    const nvbf* dos = do_buf[cur];
    const float* lse_s = lse_buf[cur];
    const float* dpre_s = dpre_buf[cur];
#pragma unroll
    for (int c0 = 0; c0 < kRows; c0 += kHalf) {
      // on the diagonal, a warp whose keys all follow these queries has nothing to add
      if (qb == kb && c0 + kHalf - 1 < warp * 16) continue;
      float st[kHalf / 8][4], dpt[kHalf / 8][4];
      product_scores<LD, HS, X4>(st, kf, qs, c0);
      product_scores<LD, HS, X4>(dpt, vf, dos, c0);
#pragma unroll
      for (int n = 0; n < kHalf / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * (e / 2), qc = c0 + n * 8 + 2 * (lane % 4) + e % 2, q = q0 + qc;
          const float p = key <= q && q < t && key < t ? __expf(st[n][e] * scale - lse_s[qc]) : 0.0f;
          st[n][e] = p;
          dpt[n][e] = p * (dpt[n][e] - dpre_s[qc]) * scale;
        }
      uint32_t pf[kHalf / 16][4], dsf[kHalf / 16][4];
      to_a(pf, st);
      to_a(dsf, dpt);
      product_rows<LD>(dv, pf, dos, c0);  // dv += pᵀ dy
      product_rows<LD>(dk, dsf, qs, c0);  // dk += dSᵀ q
    }
    __syncthreads();  // turn qb + 1 starts overwriting these buffers
  }
  const float one[2] = {1.0f, 1.0f};
  nvbf* out = dqkv + int64_t{b} * t * ld;
  store_rows<HS>(out, ld, 2 * int64_t{c} + int64_t{h} * HS, k0 + warp * 16, t, dv, one);
  store_rows<HS>(out, ld, c + int64_t{h} * HS, k0 + warp * 16, t, dk, one);
}

// Per query block: dq over the key blocks it sees. A warp holds its 16 rows' q and dy as
// A fragments and computes s = q kᵀ and dp = dy vᵀ, 32 keys a pass.
template <int HS, bool X4>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(nvbf* dqkv, const nvbf* dy, const nvbf* qkv, const float* lse, const float* dpre, int t, int c, int nh,
              float scale) {
  constexpr int LD = tiles::kLd<HS>;
  __shared__ __align__(128) nvbf k_buf[2][kRows * LD], v_buf[2][kRows * LD];
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // the blocks with the most keys first
  const int bh = static_cast<int>(blockIdx.y), b = bh / nh, h = bh % nh, q0 = qb * kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = lane_id();
  const int row0 = q0 + warp * 16 + lane / 4;  // this lane's rows: row0 and row0 + 8
  const auto start_keys = [&](int kb) {
    start_keys_values<HS>(k_buf[kb % 2], v_buf[kb % 2], base, ld, c, h, kb * kRows, t);
  };

  tiles::load_tile<HS>(k_buf[1], base, ld, int64_t{h} * HS, q0, t);  // buffer 1 lent to q and dy
  tiles::load_tile<HS>(v_buf[1], dy + int64_t{b} * t * c, c, int64_t{h} * HS, q0, t);
  __syncthreads();
  uint32_t qf[HS / 16][4], dof[HS / 16][4];
  rows_to_a<HS>(qf, k_buf[1], warp * 16);
  rows_to_a<HS>(dof, v_buf[1], warp * 16);
  __syncthreads();  // every warp has its fragments before buffer 1 is overwritten
  float row_lse[2], row_dpre[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    row_lse[r] = row < t ? lse[int64_t{bh} * t + row] : 0.0f;
    row_dpre[r] = row < t ? dpre[int64_t{bh} * t + row] : 0.0f;
  }
  float dq[HS / 8][4] = {};
  start_keys(0);
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * kRows;
    if (kb < qb) start_keys(kb + 1);
    wait_for_current(kb < qb);
    const nvbf* ks = k_buf[kb % 2];
    const nvbf* vs = v_buf[kb % 2];
#pragma unroll
    for (int c0 = 0; c0 < kRows; c0 += kHalf) {
      // on the diagonal, a warp whose rows all precede these keys has nothing to add
      if (kb == qb && c0 > warp * 16 + 15) continue;
      float s[kHalf / 8][4], dp[kHalf / 8][4];
      product_scores<LD, HS, X4>(s, qf, ks, c0);
      product_scores<LD, HS, X4>(dp, dof, vs, c0);
#pragma unroll
      for (int n = 0; n < kHalf / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + 8 * (e / 2), key = k0 + c0 + n * 8 + 2 * (lane % 4) + e % 2;
          const float p = key <= row && row < t && key < t ? __expf(s[n][e] * scale - row_lse[e / 2]) : 0.0f;
          dp[n][e] = p * (dp[n][e] - row_dpre[e / 2]) * scale;
        }
      uint32_t dsf[kHalf / 16][4];
      to_a(dsf, dp);
      product_rows<LD>(dq, dsf, ks, c0);  // dq += dS k
    }
    __syncthreads();  // turn kb + 1 starts overwriting these buffers
  }
  const float one[2] = {1.0f, 1.0f};
  store_rows<HS>(dqkv + int64_t{b} * t * ld, ld, int64_t{h} * HS, q0 + warp * 16, t, dq, one);
}

template <int HS, bool X4>
void forward_hs(nvbf* y, float* lse, const nvbf* qkv, int b, int t, int c, int nh, cudaStream_t stream) {
  const dim3 grid((t + kRows - 1) / kRows, b * nh);
  forward_kernel<HS, X4><<<grid, kThreads, 0, stream>>>(y, lse, qkv, t, c, nh, 1.0f / sqrtf(float(HS)));
}

template <int HS, bool X4>
void backward_hs(nvbf* dqkv, const float* dpre, const nvbf* dy, const nvbf* qkv, const float* lse, int b, int t, int c,
                 int nh, cudaStream_t stream) {
  const dim3 grid((t + kRows - 1) / kRows, b * nh);
  const float scale = 1.0f / sqrtf(float(HS));
  dkv_kernel<HS, X4><<<grid, kThreads, 0, stream>>>(dqkv, dy, qkv, lse, dpre, t, c, nh, scale);
  dq_kernel<HS, X4><<<grid, kThreads, 0, stream>>>(dqkv, dy, qkv, lse, dpre, t, c, nh, scale);
}

}  // namespace

void attention_forward_mma(bf16* y, float* lse, const bf16* qkv, int64_t b, int64_t t, int64_t c, int64_t nh,
                           cudaStream_t stream, bool x4) {
  auto* yy = reinterpret_cast<nvbf*>(y);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) (x4 ? forward_hs<32, true> : forward_hs<32, false>)(yy, lse, in, ib, it, ic, inh, stream);
  if (c / nh == 64) (x4 ? forward_hs<64, true> : forward_hs<64, false>)(yy, lse, in, ib, it, ic, inh, stream);
}

void attention_backward_mma(bf16* dqkv, const float* dpre, const bf16* dy, const bf16* qkv, const float* lse,
                            int64_t b, int64_t t, int64_t c, int64_t nh, cudaStream_t stream, bool x4) {
  auto* d = reinterpret_cast<nvbf*>(dqkv);
  const auto* g = reinterpret_cast<const nvbf*>(dy);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) (x4 ? backward_hs<32, true> : backward_hs<32, false>)(d, dpre, g, in, lse, ib, it, ic, inh, stream);
  if (c / nh == 64) (x4 ? backward_hs<64, true> : backward_hs<64, false>)(d, dpre, g, in, lse, ib, it, ic, inh, stream);
}

}  // namespace loom::gpu::kern
