// Causal self-attention on tensor cores, flash-style (docs/gpu.md, "Attention"): blocks of
// 64 queries against blocks of 64 keys, an online softmax, no (T, T) matrix anywhere.
// Legend: B batch, T time, C channels, NH heads, HS head size; a CUDA block of 4 warps takes
// 64 rows, each warp 16 of them, and multiplies with 16 x 16 x 16 bf16 fragments (WMMA)
// accumulating in f32.
//
// Backward runs two kernels so that nothing is added with atomics: one per key block for
// dk and dv (looping over the query blocks at or after it), one per query block for dq
// (looping over the key blocks at or before it); both recompute the probabilities from the
// forward's log-sum-exp, as the CPU's attention_backward does.
#include <cuda_bf16.h>
#include <mma.h>

#include "gpu/kernels.h"

namespace loom::gpu::kern {
namespace {

using nvbf = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kRows = 64;     // queries (or keys) a block takes
constexpr int kWarps = 4;     // each takes 16 of them
constexpr int kThreads = kWarps * 32;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, nvbf, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, nvbf, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, nvbf, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// rows [r0, r0 + 64) of one head's HS columns at `col` of qkv-like rows `ld` apart into
// tile (64, HS); rows at or past T read as 0.
template <int HS>
__device__ void load_tile(nvbf* tile, const nvbf* base, int64_t ld, int64_t col, int r0, int t) {
  for (int i = threadIdx.x; i < kRows * HS; i += kThreads) {
    const int r = i / HS, d = i % HS;
    tile[i] = r0 + r < t ? base[int64_t{r0 + r} * ld + col + d] : __float2bfloat16(0.0f);
  }
}

// out (16, 64) f32 at ld 64 = a (16, HS) rows of a tile times b (64, HS)^T, b's rows as
// columns: the scores of 16 rows against a block of 64.
template <int HS>
__device__ void product_abt(float* out, const nvbf* a, const nvbf* b) {
  for (int n = 0; n < kRows / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * 16, HS);
      wmma::load_matrix_sync(fb, b + n * 16 * HS + kk * 16, HS);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kRows, wmma::mem_row_major);
  }
}

// acc[n] (16, 16 each; 16 x HS in all) += a (16, 64) at ld 64 times b (64, HS).
template <int HS>
__device__ void product_ab_add(FragAcc* acc, const nvbf* a, const nvbf* b) {
  for (int n = 0; n < HS / 16; ++n)
    for (int kk = 0; kk < kRows / 16; ++kk) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kRows);
      wmma::load_matrix_sync(fb, b + kk * 16 * HS + n * 16, HS);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
}

// Writes 16 rows of HS f32 fragments (through `stage`, 16 x HS floats of this warp) as bf16
// to rows r0.. of dst (rows ld apart, at column col); rows at or past T are skipped.
template <int HS>
__device__ void store_rows(nvbf* dst, int64_t ld, int64_t col, int r0, int t, FragAcc* acc, float* stage) {
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(stage + n * 16, acc[n], HS, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * HS; i += 32) {
    const int r = i / HS, d = i % HS;
    if (r0 + r < t) dst[int64_t{r0 + r} * ld + col + d] = __float2bfloat16_rn(stage[i]);
  }
}

template <int HS>
constexpr size_t forward_smem() {
  return 3 * kRows * HS * sizeof(nvbf) + kRows * kRows * (sizeof(float) + sizeof(nvbf)) + kRows * HS * sizeof(float) +
         2 * kRows * sizeof(float);
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(nvbf* y, float* lse, const nvbf* qkv, int t, int c, int nh, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  nvbf* qs = reinterpret_cast<nvbf*>(smem);
  nvbf* ks = qs + kRows * HS;
  nvbf* vs = ks + kRows * HS;
  float* ss = reinterpret_cast<float*>(vs + kRows * HS);  // (64, 64) scores
  nvbf* ps = reinterpret_cast<nvbf*>(ss + kRows * kRows);  // (64, 64) probabilities
  float* os = reinterpret_cast<float*>(ps + kRows * kRows);  // (64, HS) output so far
  float* row_m = os + kRows * HS;
  float* row_l = row_m + kRows;

  const int qb = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int q0 = qb * kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<HS>(qs, base, ld, int64_t{h} * HS, q0, t);
  for (int i = threadIdx.x; i < kRows * HS; i += kThreads) os[i] = 0.0f;
  for (int i = threadIdx.x; i < kRows; i += kThreads) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * kRows;
    __syncthreads();  // the previous block's keys and values are no longer read
    load_tile<HS>(ks, base, ld, c + int64_t{h} * HS, k0, t);
    load_tile<HS>(vs, base, ld, 2 * int64_t{c} + h * HS, k0, t);
    __syncthreads();
    product_abt<HS>(ss + warp * 16 * kRows, qs + warp * 16 * HS, ks);
    __syncwarp();
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r, tq = q0 + row;
      float s[2];
      for (int j = 0; j < 2; ++j) {
        const int key = k0 + lane + 32 * j;
        s[j] = key <= tq && key < t ? ss[row * kRows + lane + 32 * j] * scale : -INFINITY;
      }
      float mx = fmaxf(s[0], s[1]);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // key k0 <= q0 <= tq is always allowed, so mx is finite
      const float m_old = row_m[row];
      const float m_new = fmaxf(m_old, mx);
      const float p0 = __expf(s[0] - m_new), p1 = __expf(s[1] - m_new);
      float sum = p0 + p1;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float alpha = __expf(m_old - m_new);
      ps[row * kRows + lane] = __float2bfloat16_rn(p0);
      ps[row * kRows + lane + 32] = __float2bfloat16_rn(p1);
      for (int d = lane; d < HS; d += 32) os[row * HS + d] *= alpha;
      __syncwarp();  // every lane has read row_m before lane 0 writes it
      if (lane == 0) {
        row_m[row] = m_new;
        row_l[row] = row_l[row] * alpha + sum;
      }
    }
    __syncwarp();
    FragAcc acc[HS / 16];
    for (int n = 0; n < HS / 16; ++n)
      wmma::load_matrix_sync(acc[n], os + warp * 16 * HS + n * 16, HS, wmma::mem_row_major);
    product_ab_add<HS>(acc, ps + warp * 16 * kRows, vs);
    for (int n = 0; n < HS / 16; ++n)
      wmma::store_matrix_sync(os + warp * 16 * HS + n * 16, acc[n], HS, wmma::mem_row_major);
  }
  __syncwarp();
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r, tq = q0 + row;
    if (tq >= t) break;
    const float inv = 1.0f / row_l[row];
    nvbf* out = y + (int64_t{b} * t + tq) * c + int64_t{h} * HS;
    for (int d = lane; d < HS; d += 32) out[d] = __float2bfloat16_rn(os[row * HS + d] * inv);
    if (lane == 0) lse[int64_t{bh} * t + tq] = row_m[row] + logf(row_l[row]);
  }
}

// dpre (B, NH, T) = rowsum(dy * y) per head: one warp per (token, head).
__global__ void attention_dpre_kernel(float* dpre, const nvbf* dy, const nvbf* y, int64_t n, int t, int c, int nh) {
  const int64_t w = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= n * nh) return;
  const int64_t row = w / nh;
  const int h = static_cast<int>(w % nh), hs = c / nh;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) {
    const int64_t i = row * c + int64_t{h} * hs + d;
    s += __bfloat162float(dy[i]) * __bfloat162float(y[i]);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) dpre[(row / t * nh + h) * t + row % t] = s;
}

template <int HS>
constexpr size_t backward_smem() {
  // four (64, HS) tiles; per warp scores and their gradient (16, 64) f32 and bf16 each;
  // lse and dpre of 64 rows
  return 4 * kRows * HS * sizeof(nvbf) + kWarps * 16 * kRows * 2 * (sizeof(float) + sizeof(nvbf)) +
         2 * kRows * sizeof(float);
}

struct BackwardSmem {
  nvbf *t0, *t1, *t2, *t3;  // the four tiles
  float *s, *dp;            // this warp's (16, 64) f32
  nvbf *p, *ds;             // this warp's (16, 64) bf16
  float *lse, *dpre;        // (64)
};

template <int HS>
__device__ BackwardSmem backward_smem_parts(unsigned char* smem) {
  BackwardSmem m;
  const int warp = threadIdx.x / 32;
  m.t0 = reinterpret_cast<nvbf*>(smem);
  m.t1 = m.t0 + kRows * HS;
  m.t2 = m.t1 + kRows * HS;
  m.t3 = m.t2 + kRows * HS;
  float* f = reinterpret_cast<float*>(m.t3 + kRows * HS);
  m.s = f + warp * 16 * kRows;
  m.dp = f + (kWarps + warp) * 16 * kRows;
  nvbf* hb = reinterpret_cast<nvbf*>(f + 2 * kWarps * 16 * kRows);
  m.p = hb + warp * 16 * kRows;
  m.ds = hb + (kWarps + warp) * 16 * kRows;
  m.lse = reinterpret_cast<float*>(hb + 2 * kWarps * 16 * kRows);
  m.dpre = m.lse + kRows;
  return m;
}

// lse and dpre of the 64 query rows from q0 (0 past T).
__device__ void load_row_stats(float* lse_s, float* dpre_s, const float* lse, const float* dpre, int q0, int t) {
  for (int i = threadIdx.x; i < kRows; i += kThreads) {
    lse_s[i] = q0 + i < t ? lse[q0 + i] : 0.0f;
    dpre_s[i] = q0 + i < t ? dpre[q0 + i] : 0.0f;
  }
}

// Per key block: dk and dv, over the query blocks that see it.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(nvbf* dqkv, const nvbf* dy, const nvbf* qkv, const float* lse, const float* dpre, int t,
                         int c, int nh, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem m = backward_smem_parts<HS>(smem);
  nvbf *ks = m.t0, *vs = m.t1, *qs = m.t2, *dos = m.t3;
  const int kb = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int k0 = kb * kRows, n_blocks = (t + kRows - 1) / kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const nvbf* dbase = dy + int64_t{b} * t * c;
  const float* lse_h = lse + int64_t{bh} * t;
  const float* dpre_h = dpre + int64_t{bh} * t;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<HS>(ks, base, ld, c + int64_t{h} * HS, k0, t);
  load_tile<HS>(vs, base, ld, 2 * int64_t{c} + h * HS, k0, t);
  FragAcc dk[HS / 16], dv[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int qb = kb; qb < n_blocks; ++qb) {
    const int q0 = qb * kRows;
    __syncthreads();
    load_tile<HS>(qs, base, ld, int64_t{h} * HS, q0, t);
    load_tile<HS>(dos, dbase, c, int64_t{h} * HS, q0, t);
    load_row_stats(m.lse, m.dpre, lse_h, dpre_h, q0, t);
    __syncthreads();
    // s^T (16 keys, 64 queries) = k q^T; dp^T = v dy^T
    product_abt<HS>(m.s, ks + warp * 16 * HS, qs);
    product_abt<HS>(m.dp, vs + warp * 16 * HS, dos);
    __syncwarp();
    for (int i = lane; i < 16 * kRows; i += 32) {
      const int r = i / kRows, qc = i % kRows;
      const int key = k0 + warp * 16 + r, q = q0 + qc;
      const float p = key <= q && q < t && key < t ? __expf(m.s[i] * scale - m.lse[qc]) : 0.0f;
      const nvbf pb = __float2bfloat16_rn(p);
      m.p[i] = pb;
      m.ds[i] = __float2bfloat16_rn(p * (m.dp[i] - m.dpre[qc]) * scale);
    }
    __syncwarp();
    product_ab_add<HS>(dv, m.p, dos);
    product_ab_add<HS>(dk, m.ds, qs);
  }
  store_rows<HS>(dqkv + int64_t{b} * t * ld, ld, 2 * int64_t{c} + h * HS, k0 + warp * 16, t, dv, m.s);
  __syncwarp();
  store_rows<HS>(dqkv + int64_t{b} * t * ld, ld, c + int64_t{h} * HS, k0 + warp * 16, t, dk, m.s);
}

// Per query block: dq, over the key blocks it sees.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(nvbf* dqkv, const nvbf* dy, const nvbf* qkv, const float* lse, const float* dpre, int t, int c,
                        int nh, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem m = backward_smem_parts<HS>(smem);
  nvbf *qs = m.t0, *dos = m.t1, *ks = m.t2, *vs = m.t3;
  const int qb = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int q0 = qb * kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<HS>(qs, base, ld, int64_t{h} * HS, q0, t);
  load_tile<HS>(dos, dy + int64_t{b} * t * c, c, int64_t{h} * HS, q0, t);
  load_row_stats(m.lse, m.dpre, lse + int64_t{bh} * t, dpre + int64_t{bh} * t, q0, t);
  FragAcc dq[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * kRows;
    __syncthreads();
    load_tile<HS>(ks, base, ld, c + int64_t{h} * HS, k0, t);
    load_tile<HS>(vs, base, ld, 2 * int64_t{c} + h * HS, k0, t);
    __syncthreads();
    product_abt<HS>(m.s, qs + warp * 16 * HS, ks);
    product_abt<HS>(m.dp, dos + warp * 16 * HS, vs);
    __syncwarp();
    for (int i = lane; i < 16 * kRows; i += 32) {
      const int r = i / kRows, kc = i % kRows;
      const int row = warp * 16 + r, q = q0 + row, key = k0 + kc;
      const float p = key <= q && q < t && key < t ? __expf(m.s[i] * scale - m.lse[row]) : 0.0f;
      m.ds[i] = __float2bfloat16_rn(p * (m.dp[i] - m.dpre[row]) * scale);
    }
    __syncwarp();
    product_ab_add<HS>(dq, m.ds, ks);
  }
  store_rows<HS>(dqkv + int64_t{b} * t * ld, ld, int64_t{h} * HS, q0 + warp * 16, t, dq, m.s);
}

template <int HS>
void forward_hs(nvbf* y, float* lse, const nvbf* qkv, int b, int t, int c, int nh, cudaStream_t stream) {
  constexpr size_t smem = forward_smem<HS>();
  cudaFuncSetAttribute(attention_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const dim3 grid((t + kRows - 1) / kRows, b * nh);
  attention_forward_kernel<HS><<<grid, kThreads, smem, stream>>>(y, lse, qkv, t, c, nh, 1.0f / sqrtf(float(HS)));
}

template <int HS>
void backward_hs(nvbf* dqkv, float* dpre, const nvbf* dy, const nvbf* qkv, const float* lse, int b, int t, int c,
                 int nh, cudaStream_t stream) {
  constexpr size_t smem = backward_smem<HS>();
  cudaFuncSetAttribute(attention_dkv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(attention_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const dim3 grid((t + kRows - 1) / kRows, b * nh);
  const float scale = 1.0f / sqrtf(float(HS));
  attention_dkv_kernel<HS><<<grid, kThreads, smem, stream>>>(dqkv, dy, qkv, lse, dpre, t, c, nh, scale);
  attention_dq_kernel<HS><<<grid, kThreads, smem, stream>>>(dqkv, dy, qkv, lse, dpre, t, c, nh, scale);
}

}  // namespace

bool attention_head_size_supported(int64_t hs) { return hs == 32 || hs == 64; }

void attention_forward(bf16* y, float* lse, const bf16* qkv, int64_t b, int64_t t, int64_t c, int64_t nh,
                       cudaStream_t stream) {
  auto* yy = reinterpret_cast<nvbf*>(y);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) forward_hs<32>(yy, lse, in, ib, it, ic, inh, stream);
  if (c / nh == 64) forward_hs<64>(yy, lse, in, ib, it, ic, inh, stream);
}

void attention_backward(bf16* dqkv, float* dpre, const bf16* dy, const bf16* qkv, const bf16* y, const float* lse,
                        int64_t b, int64_t t, int64_t c, int64_t nh, cudaStream_t stream) {
  auto* d = reinterpret_cast<nvbf*>(dqkv);
  const auto* g = reinterpret_cast<const nvbf*>(dy);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int64_t rows = b * t, warps = rows * nh, per_block = 256 / 32;
  attention_dpre_kernel<<<static_cast<unsigned>((warps + per_block - 1) / per_block), 256, 0, stream>>>(
      dpre, g, reinterpret_cast<const nvbf*>(y), rows, static_cast<int>(t), static_cast<int>(c), static_cast<int>(nh));
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) backward_hs<32>(d, dpre, g, in, lse, ib, it, ic, inh, stream);
  if (c / nh == 64) backward_hs<64>(d, dpre, g, in, lse, ib, it, ic, inh, stream);
}

}  // namespace loom::gpu::kern
