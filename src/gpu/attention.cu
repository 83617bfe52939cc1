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

#include "gpu/attention_tiles.cuh"
#include "gpu/kernels.h"

namespace loom::gpu::kern {
namespace {

using nvbf = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

using tiles::kRows;
using tiles::kThreads;
using tiles::kWarps;
using tiles::load_keys_values;
using tiles::load_row_stats;
using tiles::load_tile;
// Row strides in shared memory, padded past a multiple of 128 bytes so that the rows a
// fragment load or a lane reads fall in different banks.
constexpr int kLdS = kRows + 4;  // (rows, 64) f32 scores
constexpr int kLdP = kRows + 8;  // (rows, 64) bf16 probabilities
template <int HS>
constexpr int kLdT = tiles::kLd<HS>;  // (64, HS) bf16 tiles of q, k, v, dy
template <int HS>
constexpr int kLdO = HS + 4;  // (rows, HS) f32 output

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, nvbf, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, nvbf, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, nvbf, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out (16, 64) f32 at stride kLdS = a (16, HS) rows of a tile times b (64, HS)^T, b's rows
// as columns: the scores of 16 rows against a block of 64.
template <int HS>
__device__ void product_abt(float* out, const nvbf* a, const nvbf* b) {
  for (int n = 0; n < kRows / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kLdT<HS>);
      wmma::load_matrix_sync(fb, b + n * 16 * kLdT<HS> + kk * 16, kLdT<HS>);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] (16, 16 each; 16 x HS in all) += a (16, 64) at stride kLdP times b (64, HS), a tile.
template <int HS>
__device__ void product_ab_add(FragAcc* acc, const nvbf* a, const nvbf* b) {
  for (int n = 0; n < HS / 16; ++n)
    for (int kk = 0; kk < kRows / 16; ++kk) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kLdP);
      wmma::load_matrix_sync(fb, b + kk * 16 * kLdT<HS> + n * 16, kLdT<HS>);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
}

// Writes 16 rows of HS f32 fragments (through `stage`, 16 x kLdO floats of this warp) as
// bf16 to rows r0.. of dst (rows ld apart, at column col); rows at or past T are skipped.
template <int HS>
__device__ void store_rows(nvbf* dst, int64_t ld, int64_t col, int r0, int t, FragAcc* acc, float* stage) {
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(stage + n * 16, acc[n], kLdO<HS>, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * HS; i += 32) {
    const int r = i / HS, d = i % HS;
    if (r0 + r < t) dst[int64_t{r0 + r} * ld + col + d] = __float2bfloat16_rn(stage[r * kLdO<HS> + d]);
  }
}

template <int HS>
constexpr size_t forward_smem() {
  return 3 * kRows * kLdT<HS> * sizeof(nvbf) + kRows * kLdS * sizeof(float) + kRows * kLdP * sizeof(nvbf) +
         kRows * kLdO<HS> * sizeof(float) + 2 * kRows * sizeof(float);
}

// The online softmax of one block of scores, a row per pair of lanes: lane 2r + h of a
// warp takes row r of its 16 and the columns 2j + h, so no row waits on a chain of shuffles.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(nvbf* y, float* lse, const nvbf* qkv, int t, int c, int nh, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  nvbf* qs = reinterpret_cast<nvbf*>(smem);
  nvbf* ks = qs + kRows * kLdT<HS>;
  nvbf* vs = ks + kRows * kLdT<HS>;
  float* ss = reinterpret_cast<float*>(vs + kRows * kLdT<HS>);  // (64, 64) scores
  nvbf* ps = reinterpret_cast<nvbf*>(ss + kRows * kLdS);         // (64, 64) probabilities
  float* os = reinterpret_cast<float*>(ps + kRows * kLdP);       // (64, HS) output so far
  float* row_m = os + kRows * kLdO<HS>;
  float* row_l = row_m + kRows;

  const int qb = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int q0 = qb * kRows;
  const int64_t ld = 3 * int64_t{c};
  const nvbf* base = qkv + int64_t{b} * t * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int my_row = warp * 16 + lane / 2, half = lane % 2, tq = q0 + my_row;

  load_tile<HS>(qs, base, ld, int64_t{h} * HS, q0, t);
  for (int i = threadIdx.x; i < kRows * kLdO<HS>; i += kThreads) os[i] = 0.0f;
  for (int i = threadIdx.x; i < kRows; i += kThreads) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * kRows;
    __syncthreads();  // the previous block's keys and values are no longer read
    load_keys_values<HS>(ks, vs, base, ld, c, h, k0, t);
    __syncthreads();
    product_abt<HS>(ss + warp * 16 * kLdS, qs + warp * 16 * kLdT<HS>, ks);
    __syncwarp();
    float sv[kRows / 2];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kRows / 2; ++j) {
      const int col = 2 * j + half, key = k0 + col;
      sv[j] = key <= tq && key < t ? ss[my_row * kLdS + col] * scale : -INFINITY;
      mx = fmaxf(mx, sv[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // key k0 <= q0 <= tq is always allowed, so mx is finite
    const float m_old = row_m[my_row];
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kRows / 2; ++j) {
      const float p = __expf(sv[j] - m_new);
      sum += p;
      ps[my_row * kLdP + 2 * j + half] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float alpha = __expf(m_old - m_new);
    for (int d = half; d < HS; d += 2) os[my_row * kLdO<HS> + d] *= alpha;
    __syncwarp();  // both lanes of the row have read row_m before it is written
    if (half == 0) {
      row_m[my_row] = m_new;
      row_l[my_row] = row_l[my_row] * alpha + sum;
    }
    __syncwarp();
    FragAcc acc[HS / 16];
    for (int n = 0; n < HS / 16; ++n)
      wmma::load_matrix_sync(acc[n], os + warp * 16 * kLdO<HS> + n * 16, kLdO<HS>, wmma::mem_row_major);
    product_ab_add<HS>(acc, ps + warp * 16 * kLdP, vs);
    for (int n = 0; n < HS / 16; ++n)
      wmma::store_matrix_sync(os + warp * 16 * kLdO<HS> + n * 16, acc[n], kLdO<HS>, wmma::mem_row_major);
  }
  __syncwarp();
  if (tq < t) {
    const float inv = 1.0f / row_l[my_row];
    nvbf* out = y + (int64_t{b} * t + tq) * c + int64_t{h} * HS;
    for (int d = half; d < HS; d += 2) out[d] = __float2bfloat16_rn(os[my_row * kLdO<HS> + d] * inv);
    if (half == 0) lse[int64_t{bh} * t + tq] = row_m[my_row] + logf(row_l[my_row]);
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
  return 4 * kRows * kLdT<HS> * sizeof(nvbf) + kWarps * 16 * 2 * (kLdS * sizeof(float) + kLdP * sizeof(nvbf)) +
         2 * kRows * sizeof(float);
}

struct BackwardSmem {
  nvbf *t0, *t1, *t2, *t3;  // the four tiles
  float *s, *dp;            // this warp's (16, 64) f32, stride kLdS
  nvbf *p, *ds;             // this warp's (16, 64) bf16, stride kLdP
  float *lse, *dpre;        // (64)
};

template <int HS>
__device__ BackwardSmem backward_smem_parts(unsigned char* smem) {
  BackwardSmem m;
  const int warp = threadIdx.x / 32;
  m.t0 = reinterpret_cast<nvbf*>(smem);
  m.t1 = m.t0 + kRows * kLdT<HS>;
  m.t2 = m.t1 + kRows * kLdT<HS>;
  m.t3 = m.t2 + kRows * kLdT<HS>;
  float* f = reinterpret_cast<float*>(m.t3 + kRows * kLdT<HS>);
  m.s = f + warp * 16 * kLdS;
  m.dp = f + (kWarps + warp) * 16 * kLdS;
  nvbf* hb = reinterpret_cast<nvbf*>(f + 2 * kWarps * 16 * kLdS);
  m.p = hb + warp * 16 * kLdP;
  m.ds = hb + (kWarps + warp) * 16 * kLdP;
  m.lse = reinterpret_cast<float*>(hb + 2 * kWarps * 16 * kLdP);
  m.dpre = m.lse + kRows;
  return m;
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

  load_keys_values<HS>(ks, vs, base, ld, c, h, k0, t);
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
    product_abt<HS>(m.s, ks + warp * 16 * kLdT<HS>, qs);
    product_abt<HS>(m.dp, vs + warp * 16 * kLdT<HS>, dos);
    __syncwarp();
    for (int i = lane; i < 16 * kRows; i += 32) {
      const int r = i / kRows, qc = i % kRows;
      const int key = k0 + warp * 16 + r, q = q0 + qc;
      const float p = key <= q && q < t && key < t ? __expf(m.s[r * kLdS + qc] * scale - m.lse[qc]) : 0.0f;
      m.p[r * kLdP + qc] = __float2bfloat16_rn(p);
      m.ds[r * kLdP + qc] = __float2bfloat16_rn(p * (m.dp[r * kLdS + qc] - m.dpre[qc]) * scale);
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
    load_keys_values<HS>(ks, vs, base, ld, c, h, k0, t);
    __syncthreads();
    product_abt<HS>(m.s, qs + warp * 16 * kLdT<HS>, ks);
    product_abt<HS>(m.dp, dos + warp * 16 * kLdT<HS>, vs);
    __syncwarp();
    for (int i = lane; i < 16 * kRows; i += 32) {
      const int r = i / kRows, kc = i % kRows;
      const int row = warp * 16 + r, q = q0 + row, key = k0 + kc;
      const float p = key <= q && q < t && key < t ? __expf(m.s[r * kLdS + kc] * scale - m.lse[row]) : 0.0f;
      m.ds[r * kLdP + kc] = __float2bfloat16_rn(p * (m.dp[r * kLdS + kc] - m.dpre[row]) * scale);
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
                       cudaStream_t stream, AttentionKernels kernels) {
  if (kernels != AttentionKernels::kWmma)
    return attention_forward_mma(y, lse, qkv, b, t, c, nh, stream, kernels == AttentionKernels::kMmaX4);
  auto* yy = reinterpret_cast<nvbf*>(y);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) forward_hs<32>(yy, lse, in, ib, it, ic, inh, stream);
  if (c / nh == 64) forward_hs<64>(yy, lse, in, ib, it, ic, inh, stream);
}

void attention_backward(bf16* dqkv, float* dpre, const bf16* dy, const bf16* qkv, const bf16* y, const float* lse,
                        int64_t b, int64_t t, int64_t c, int64_t nh, cudaStream_t stream, AttentionKernels kernels) {
  auto* d = reinterpret_cast<nvbf*>(dqkv);
  const auto* g = reinterpret_cast<const nvbf*>(dy);
  const auto* in = reinterpret_cast<const nvbf*>(qkv);
  const int64_t rows = b * t, warps = rows * nh, per_block = 256 / 32;
  attention_dpre_kernel<<<static_cast<unsigned>((warps + per_block - 1) / per_block), 256, 0, stream>>>(
      dpre, g, reinterpret_cast<const nvbf*>(y), rows, static_cast<int>(t), static_cast<int>(c), static_cast<int>(nh));
  if (kernels != AttentionKernels::kWmma)
    return attention_backward_mma(dqkv, dpre, dy, qkv, lse, b, t, c, nh, stream, kernels == AttentionKernels::kMmaX4);
  const int ib = static_cast<int>(b), it = static_cast<int>(t), ic = static_cast<int>(c), inh = static_cast<int>(nh);
  if (c / nh == 32) backward_hs<32>(d, dpre, g, in, lse, ib, it, ic, inh, stream);
  if (c / nh == 64) backward_hs<64>(d, dpre, g, in, lse, ib, it, ic, inh, stream);
}

}  // namespace loom::gpu::kern
