// Loom's CUDA kernels for a GPT step, except attention (attention.cu). kernels.h says what
// each computes; the comments here say how. Reductions add in orders fixed by the shapes.
#include <cuda_bf16.h>

#include "gpu/kernels.h"

namespace loom::gpu::kern {
namespace {

using nvbf = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr float kLayerNormEps = 1e-5f;  // as PyTorch's and GPT-2's default, and the CPU's
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
__device__ __forceinline__ bf16 to_bf(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float round_bf(float v) { return to_f(to_bf(v)); }

// Eight bf16 in 16 bytes, to floats and back (the lower address in the lower half).
__device__ __forceinline__ void unpack8(float (&f)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t{to_bf(lo)} | (uint32_t{to_bf(hi)} << 16);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// Whether every pointer is 16-byte aligned: the vector kernels' condition, with their shapes'.
template <typename... P>
bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

int row_blocks(int64_t n) { return static_cast<int>(n < 65535 * 16 ? (n > 0 ? n : 1) : 65535 * 16); }

// The sum of v over the block's threads, in a fixed order (warp shuffles, then the warps'
// sums by the first warp). `shared` holds kThreads / 32 floats; every thread gets the sum.
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by the previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float s = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// block_sum of two values at once (one pair of barriers for both).
__device__ float2 block_sum2(float2 v, float2* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float2 s = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : make_float2(0.0f, 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    s.x += __shfl_xor_sync(0xffffffffu, s.x, o);
    s.y += __shfl_xor_sync(0xffffffffu, s.y, o);
  }
  return s;
}

__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float s = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__global__ void cast_kernel(bf16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = to_bf(in[i]);
}

__global__ void widen_kernel(float* out, const bf16* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = to_f(in[i]);
}

__global__ void embedding_kernel(bf16* x, const int32_t* tokens, const float* wte, const float* wpe, int64_t n,
                                 int64_t t, int64_t c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * c; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, col = i % c;
    x[i] = to_bf(wte[tokens[row] * c + col] + wpe[(row % t) * c + col]);
  }
}

__global__ void wpe_backward_kernel(float* dwpe, const bf16* dx, int64_t b, int64_t t, int64_t c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < t * c; i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int64_t s_b = 0; s_b < b; ++s_b) s += to_f(dx[s_b * t * c + i]);
    dwpe[i] += s;
  }
}

__global__ void wte_backward_kernel(float* dwte, const bf16* dx, const int32_t* rows, const int32_t* starts,
                                    const int32_t* ids, int64_t c) {
  const int64_t id = blockIdx.x;
  for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
    float s = 0.0f;
    for (int32_t r = starts[id]; r < starts[id + 1]; ++r) s += to_f(dx[int64_t{rows[r]} * c + col]);
    dwte[int64_t{ids[id]} * c + col] += s;
  }
}

// One warp per row: the mean, then the variance about it (two passes over the row, which
// is in L1 after the first).
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* x, const float* w,
                                         const float* b, int64_t n, int64_t c) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const bf16* xr = x + row * c;
  float s = 0.0f;
  for (int64_t i = lane; i < c; i += 32) s += to_f(xr[i]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float mu = s / static_cast<float>(c);
  float q = 0.0f;
  for (int64_t i = lane; i < c; i += 32) {
    const float d = to_f(xr[i]) - mu;
    q += d * d;
  }
  for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
  const float rs = 1.0f / sqrtf(q / static_cast<float>(c) + kLayerNormEps);
  for (int64_t i = lane; i < c; i += 32) out[row * c + i] = to_bf((to_f(xr[i]) - mu) * rs * w[i] + b[i]);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

constexpr int kLnCols = 4096 / kThreads;  // columns a thread owns in layernorm_backward

// A block takes kLnRows rows; each thread owns columns tid, tid + 256, ..., and keeps its
// columns' weight and bias gradient sums over the block's rows in registers.
__global__ void layernorm_backward_kernel(bf16* dx, float* dw_part, float* db_part, const bf16* dy, const bf16* x,
                                          const float* mean, const float* rstd, const float* w, const bf16* dres,
                                          int64_t n, int64_t c) {
  __shared__ float2 shared2[kThreads / 32];
  float dw[kLnCols], db[kLnCols];
  for (int k = 0; k < kLnCols; ++k) dw[k] = db[k] = 0.0f;
  const int64_t first = blockIdx.x * kLnRows;
  for (int64_t row = first; row < first + kLnRows && row < n; ++row) {
    const float mu = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int k = 0; k < kLnCols; ++k) {
      const int64_t col = threadIdx.x + int64_t{k} * kThreads;
      if (col >= c) break;
      const float g = to_f(dy[row * c + col]);
      const float xhat = (to_f(x[row * c + col]) - mu) * rs;
      const float gw = g * w[col];
      s1 += gw;
      s2 += gw * xhat;
      dw[k] += g * xhat;
      db[k] += g;
    }
    const float2 both = block_sum2(make_float2(s1, s2), shared2);
    s1 = both.x / static_cast<float>(c);
    s2 = both.y / static_cast<float>(c);
    for (int k = 0; k < kLnCols; ++k) {
      const int64_t col = threadIdx.x + int64_t{k} * kThreads;
      if (col >= c) break;
      const float g = to_f(dy[row * c + col]);
      const float xhat = (to_f(x[row * c + col]) - mu) * rs;
      float v = rs * (g * w[col] - s1 - xhat * s2);
      if (dres != nullptr) v += to_f(dres[row * c + col]);
      dx[row * c + col] = to_bf(v);
    }
  }
  for (int k = 0; k < kLnCols; ++k) {
    const int64_t col = threadIdx.x + int64_t{k} * kThreads;
    if (col >= c) break;
    dw_part[blockIdx.x * c + col] = dw[k];
    db_part[blockIdx.x * c + col] = db[k];
  }
}

// layernorm_backward for C a multiple of 8 up to 8 * 32 * kLnVecs: a block of 4 warps takes
// kLnRows rows, a warp a row at a time (rows w, w + 4, ...); lane l owns the 8-column
// vectors l, l + 32, ... of every row, read 16 bytes at a time, and keeps their weight and
// bias gradient sums in registers; the warps' sums are added in warp order at the end.
constexpr int kLnWarps = 4;
constexpr int kLnVecCols = 8 * 32 * 4;  // the widest row it takes: 1024
template <int kLnVecs>
__global__ void __launch_bounds__(kLnWarps * 32)
    layernorm_backward_vec_kernel(bf16* dx, float* dw_part, float* db_part, const bf16* dy, const bf16* x,
                                  const float* mean, const float* rstd, const float* w, const bf16* dres, int64_t n,
                                  int c) {
  __shared__ float red[kLnWarps][8 * 32 * kLnVecs];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int vecs = c / 8;
  float wv[kLnVecs][8], dw[kLnVecs][8] = {}, db[kLnVecs][8] = {};
#pragma unroll
  for (int j = 0; j < kLnVecs; ++j) {
    const int vec = lane + 32 * j;
#pragma unroll
    for (int k = 0; k < 8; ++k) wv[j][k] = vec < vecs ? w[8 * vec + k] : 0.0f;
  }
  const int64_t first = blockIdx.x * kLnRows;
  for (int64_t row = first + warp; row < first + kLnRows && row < n; row += kLnWarps) {
    const float mu = mean[row], rs = rstd[row];
    float g[kLnVecs][8], xh[kLnVecs][8];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kLnVecs; ++j) {
      const int vec = lane + 32 * j;
      if (vec < vecs) {
        unpack8(g[j], reinterpret_cast<const uint4*>(dy + row * c)[vec]);
        unpack8(xh[j], reinterpret_cast<const uint4*>(x + row * c)[vec]);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) g[j][k] = xh[j][k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        xh[j][k] = (xh[j][k] - mu) * rs;
        const float gw = g[j][k] * wv[j][k];
        s1 += gw;
        s2 += gw * xh[j][k];
        dw[j][k] += g[j][k] * xh[j][k];
        db[j][k] += g[j][k];
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
      s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    s1 /= static_cast<float>(c);
    s2 /= static_cast<float>(c);
#pragma unroll
    for (int j = 0; j < kLnVecs; ++j) {
      const int vec = lane + 32 * j;
      if (vec >= vecs) continue;
      float res[8] = {};
      if (dres != nullptr) unpack8(res, reinterpret_cast<const uint4*>(dres + row * c)[vec]);
      float out[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = rs * (g[j][k] * wv[j][k] - s1 - xh[j][k] * s2) + res[k];
      reinterpret_cast<uint4*>(dx + row * c)[vec] = pack8(out);
    }
  }
  // the four warps' sums of each column, in warp order: weight gradients, then bias
  for (int pass = 0; pass < 2; ++pass) {
    float* part = pass == 0 ? dw_part : db_part;
#pragma unroll
    for (int j = 0; j < kLnVecs; ++j) {
      const int vec = lane + 32 * j;
      if (vec >= vecs) continue;
#pragma unroll
      for (int k = 0; k < 8; ++k) red[warp][8 * vec + k] = pass == 0 ? dw[j][k] : db[j][k];
    }
    __syncthreads();
    for (int col = static_cast<int>(threadIdx.x); col < c; col += kLnWarps * 32) {
      float s = 0.0f;
      for (int k = 0; k < kLnWarps; ++k) s += red[k][col];
      part[blockIdx.x * int64_t{c} + col] = s;
    }
    __syncthreads();
  }
}

// A block per 32 columns, 32 groups of threads down the parts: group g adds parts g, g + 32,
// ..., then the first group adds the 32 sums in order.
__global__ void add_partials_kernel(float* dst, const float* parts, int64_t p, int64_t m) {
  __shared__ float sums[32][33];
  const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
  const int64_t col = blockIdx.x * int64_t{32} + lane;
  float s = 0.0f;
  if (col < m)
#pragma unroll 4
    for (int64_t i = group; i < p; i += 32) s += parts[i * m + col];
  sums[group][lane] = s;
  __syncthreads();
  if (group == 0 && col < m) {
    float total = 0.0f;
    for (int g = 0; g < 32; ++g) total += sums[g][lane];
    dst[col] += total;
  }
}

__global__ void add_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
}

__global__ void column_sums_kernel(float* parts, const bf16* y, int64_t n, int64_t m) {
  const int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (col >= m) return;
  const int64_t first = blockIdx.y * kColRows;
  float s = 0.0f;
#pragma unroll 8
  for (int64_t r = first; r < first + kColRows && r < n; ++r) s += to_f(y[r * m + col]);
  parts[blockIdx.y * m + col] = s;
}

// column_sums for M a multiple of 8: a block takes 256 columns (32 vectors of 8) of one
// chunk of kColRows rows; its 8 warps take 32 rows each, a lane a 16-byte vector a row,
// and the warps' sums are added in warp order.
static_assert(kColRows == 8 * 32, "column_sums_vec_kernel: 8 warps of 32 rows");
__global__ void __launch_bounds__(256) column_sums_vec_kernel(float* parts, const bf16* y, int64_t n, int64_t m) {
  __shared__ float sums[8][8 * 32];
  const int lane = static_cast<int>(threadIdx.x % 32), group = static_cast<int>(threadIdx.x / 32);
  const int64_t vecs = m / 8, vec = blockIdx.x * int64_t{32} + lane;
  float s[8] = {};
  if (vec < vecs) {
    const int64_t first = blockIdx.y * kColRows + group * 32;
    for (int64_t r = first; r < first + 32 && r < n; ++r) {
      float f[8];
      unpack8(f, reinterpret_cast<const uint4*>(y + r * m)[vec]);
#pragma unroll
      for (int k = 0; k < 8; ++k) s[k] += f[k];
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) sums[group][k * 32 + lane] = s[k];
  __syncthreads();
  const int local = static_cast<int>(threadIdx.x);  // column blockIdx.x * 256 + local
  const int64_t col = blockIdx.x * int64_t{256} + local;
  if (col >= m) return;
  float total = 0.0f;
  for (int g = 0; g < 8; ++g) total += sums[g][(local % 8) * 32 + local / 8];
  parts[blockIdx.y * m + col] = total;
}

// The epilogues take a row per block (grid-stride over rows), threads over its columns:
// no division per element to find the bias.
__global__ void bias_kernel(bf16* out, const float* acc, const float* bias, int64_t n, int64_t m) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x)
    for (int64_t col = threadIdx.x; col < m; col += blockDim.x) {
      const int64_t i = row * m + col;
      out[i] = to_bf(acc[i] + bias[col]);
    }
}

__global__ void bias_residual_kernel(bf16* out, const float* acc, const float* bias, const bf16* residual, int64_t n,
                                     int64_t m) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x)
    for (int64_t col = threadIdx.x; col < m; col += blockDim.x) {
      const int64_t i = row * m + col;
      out[i] = to_bf(to_f(residual[i]) + round_bf(acc[i] + bias[col]));
    }
}

__global__ void bias_gelu_kernel(bf16* h, bf16* g, const float* acc, const float* bias, int64_t n, int64_t m) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x)
    for (int64_t col = threadIdx.x; col < m; col += blockDim.x) {
      const int64_t i = row * m + col;
      const float hv = round_bf(acc[i] + bias[col]);
      h[i] = to_bf(hv);
      g[i] = to_bf(gelu(hv));
    }
}

// The epilogues for M a multiple of 4: four columns a thread, 16-byte loads of the f32
// accumulators and bias, 8-byte stores (and loads of the residual).
__device__ __forceinline__ void unpack4(float (&f)[4], uint2 v) {
  f[0] = __uint_as_float(v.x << 16);
  f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16);
  f[3] = __uint_as_float(v.y & 0xffff0000u);
}
__device__ __forceinline__ uint2 pack4(const float (&f)[4]) { return make_uint2(pack2(f[0], f[1]), pack2(f[2], f[3])); }

// kind 0: out = round(acc + b); 1: out = round(residual + round(acc + b)); 2: out (h) =
// round(acc + b) and g = round(gelu(h)).
template <int kKind>
__global__ void epilogue_vec_kernel(bf16* out, bf16* g, const float* acc, const float* bias, const bf16* residual,
                                    int64_t n, int64_t m) {
  const int64_t quads = m / 4;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x)
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const int64_t i = row * quads + q;
      const float4 a = reinterpret_cast<const float4*>(acc)[i];
      const float4 bb = reinterpret_cast<const float4*>(bias)[q];
      float h[4] = {round_bf(a.x + bb.x), round_bf(a.y + bb.y), round_bf(a.z + bb.z), round_bf(a.w + bb.w)};
      if constexpr (kKind == 1) {
        float r[4];
        unpack4(r, reinterpret_cast<const uint2*>(residual)[i]);
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] += r[k];
      }
      reinterpret_cast<uint2*>(out)[i] = pack4(h);
      if constexpr (kKind == 2) {
        float gv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) gv[k] = gelu(h[k]);
        reinterpret_cast<uint2*>(g)[i] = pack4(gv);
      }
    }
}

__device__ __forceinline__ float gelu_grad(float x, float dg) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float th = tanhf(u);
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  return (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * dg;
}

// gelu_backward for n a multiple of 8: 16 bytes of h and dg a thread.
__global__ void gelu_backward_vec_kernel(bf16* dh, const bf16* h, const bf16* dg, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / 8; i += int64_t{gridDim.x} * blockDim.x) {
    float x[8], d[8];
    unpack8(x, reinterpret_cast<const uint4*>(h)[i]);
    unpack8(d, reinterpret_cast<const uint4*>(dg)[i]);
#pragma unroll
    for (int k = 0; k < 8; ++k) d[k] = gelu_grad(x[k], d[k]);
    reinterpret_cast<uint4*>(dh)[i] = pack8(d);
  }
}

__global__ void gelu_backward_kernel(bf16* dh, const bf16* h, const bf16* dg, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dh[i] = to_bf(gelu_grad(to_f(h[i]), to_f(dg[i])));
  }
}

// One block per row: its largest logit, the sum of exponentials, then the gradient in place.
__global__ void cross_entropy_kernel(float* losses, bf16* logits, const int32_t* targets, int64_t v, int64_t ldv,
                                     float dscale) {
  __shared__ float shared[kThreads / 32];
  bf16* row = logits + blockIdx.x * ldv;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) mx = fmaxf(mx, to_f(row[i]));
  mx = block_max(mx, shared);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) s += expf(to_f(row[i]) - mx);
  s = block_sum(s, shared);
  const float lse = mx + logf(s);
  const int32_t target = targets[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_f(row[target]);
  __syncthreads();  // the target's logit is read before any thread overwrites it
  for (int64_t i = threadIdx.x; i < ldv; i += blockDim.x) {
    const float d = i < v ? (expf(to_f(row[i]) - lse) - (i == target ? 1.0f : 0.0f)) * dscale : 0.0f;
    row[i] = to_bf(d);
  }
}

// A running (max, sum of exp(x - max)) merged with another: the log-sum-exp's online form.
// A side with no element yet (max -inf, sum 0) leaves the other as it is.
__device__ __forceinline__ void merge_lse(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// cross_entropy for rows of a multiple of 8 columns (16-byte aligned): one block per row;
// each thread keeps an online (max, sum) over its 8-column vectors in one pass, the block
// merges them in a fixed order (shuffles, then the warps' results in warp order), and a
// second pass writes the gradient 16 bytes at a time.
__global__ void cross_entropy_vec_kernel(float* losses, bf16* logits, const int32_t* targets, int64_t v, int64_t ldv,
                                         float dscale) {
  __shared__ float shared_m[kThreads / 32], shared_s[kThreads / 32];
  uint4* row = reinterpret_cast<uint4*>(logits + blockIdx.x * ldv);
  const int64_t vecs = ldv / 8;
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    float f[8];
    unpack8(f, row[i]);
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < 8; ++k) mx = fmaxf(mx, 8 * i + k < v ? f[k] : -INFINITY);
    if (mx == -INFINITY) continue;
    float e = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) e += 8 * i + k < v ? expf(f[k] - mx) : 0.0f;
    merge_lse(m, s, mx, e);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_lse(m, s, m2, s2);
  }
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
  }
  __syncthreads();
  m = shared_m[0];
  s = shared_s[0];
  for (int k = 1; k < static_cast<int>(blockDim.x / 32); ++k) merge_lse(m, s, shared_m[k], shared_s[k]);
  const float lse = m + logf(s);
  const int32_t target = targets[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_f(logits[blockIdx.x * ldv + target]);
  __syncthreads();  // the target's logit is read before any thread overwrites it
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    float f[8];
    unpack8(f, row[i]);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t col = 8 * i + k;
      f[k] = col < v ? (expf(f[k] - lse) - (col == target ? 1.0f : 0.0f)) * dscale : 0.0f;
    }
    row[i] = pack8(f);
  }
}

__device__ double block_sum_double(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

__global__ void reduce_partial_kernel(double* scratch, const float* x, int64_t n, bool square) {
  __shared__ double shared[kThreads];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    s += square ? v * v : v;
  }
  const double total = block_sum_double(s, shared);
  if (threadIdx.x == 0) scratch[blockIdx.x] = total;
}

__global__ void reduce_final_kernel(double* out, const double* scratch, int parts) {
  __shared__ double shared[kThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += scratch[i];
  const double total = block_sum_double(s, shared);
  if (threadIdx.x == 0) out[0] = total;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* p_bf16, const AdamChunk* chunks,
                             AdamArgs a) {
  const AdamChunk ch = chunks[blockIdx.x];
  const float decay = ch.decay ? 1.0f - a.lr * a.weight_decay : 1.0f;
  const float step = a.lr / a.bias1;
  for (int64_t i = ch.begin + threadIdx.x; i < ch.begin + ch.len; i += blockDim.x) {
    const float grad = g[i] * a.grad_scale;
    const int64_t j = i - a.state_offset;
    const float mi = m[j] + (grad - m[j]) * (1.0f - a.beta1);
    const float vi = a.beta2 * v[j] + (1.0f - a.beta2) * grad * grad;
    const float pi = p[i] * decay - step * mi / (sqrtf(vi) / a.bias2_sqrt + a.eps);
    m[j] = mi;
    v[j] = vi;
    p[i] = pi;
    p_bf16[i] = to_bf(pi);
  }
}

}  // namespace

void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
}

void widen_bf16(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
}

void embedding_forward(bf16* x, const int32_t* tokens, const float* wte, const float* wpe, int64_t n, int64_t t,
                       int64_t c, cudaStream_t stream) {
  embedding_kernel<<<blocks_for(n * c), kThreads, 0, stream>>>(x, tokens, wte, wpe, n, t, c);
}

void wpe_backward(float* dwpe, const bf16* dx, int64_t b, int64_t t, int64_t c, cudaStream_t stream) {
  wpe_backward_kernel<<<blocks_for(t * c), kThreads, 0, stream>>>(dwpe, dx, b, t, c);
}

void wte_backward(float* dwte, const bf16* dx, const int32_t* rows, const int32_t* starts, const int32_t* ids,
                  int64_t n_ids, int64_t c, cudaStream_t stream) {
  if (n_ids == 0) return;
  wte_backward_kernel<<<static_cast<unsigned>(n_ids), kThreads, 0, stream>>>(dwte, dx, rows, starts, ids, c);
}

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const float* w, const float* b, int64_t n,
                       int64_t c, cudaStream_t stream) {
  const int64_t rows_per_block = kThreads / 32;
  layernorm_forward_kernel<<<static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block), kThreads, 0, stream>>>(
      out, mean, rstd, x, w, b, n, c);
}

void layernorm_backward(bf16* dx, float* dw_part, float* db_part, const bf16* dy, const bf16* x, const float* mean,
                        const float* rstd, const float* w, const bf16* dres, int64_t n, int64_t c,
                        cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(layernorm_partials(n));
  if (c % 8 == 0 && c <= kLnVecCols && aligned16(dx, dy, x, dres)) {
    const auto launch = [&](auto kernel) {
      kernel<<<blocks, kLnWarps * 32, 0, stream>>>(dx, dw_part, db_part, dy, x, mean, rstd, w, dres, n,
                                                   static_cast<int>(c));
    };
    const int64_t vecs = (c / 8 + 31) / 32;  // a lane's vectors
    if (vecs == 1) launch(layernorm_backward_vec_kernel<1>);
    if (vecs == 2) launch(layernorm_backward_vec_kernel<2>);
    if (vecs == 3) launch(layernorm_backward_vec_kernel<3>);
    if (vecs == 4) launch(layernorm_backward_vec_kernel<4>);
  } else
    layernorm_backward_kernel<<<blocks, kThreads, 0, stream>>>(dx, dw_part, db_part, dy, x, mean, rstd, w, dres, n, c);
}

void add_partials(float* dst, const float* parts, int64_t p, int64_t m, cudaStream_t stream) {
  add_partials_kernel<<<static_cast<unsigned>((m + 31) / 32), 1024, 0, stream>>>(dst, parts, p, m);
}

void add(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n);
}

void column_sums(float* parts, const bf16* y, int64_t n, int64_t m, cudaStream_t stream) {
  const auto chunks = static_cast<unsigned>(column_sum_parts(n));
  if (m % 8 == 0 && aligned16(y)) {
    const dim3 grid(static_cast<unsigned>((m + 255) / 256), chunks);
    column_sums_vec_kernel<<<grid, 256, 0, stream>>>(parts, y, n, m);
  } else {
    const dim3 grid(static_cast<unsigned>((m + kThreads - 1) / kThreads), chunks);
    column_sums_kernel<<<grid, kThreads, 0, stream>>>(parts, y, n, m);
  }
}

void bias_forward(bf16* out, const float* acc, const float* bias, int64_t n, int64_t m, cudaStream_t stream) {
  if (m % 4 == 0 && aligned16(out, acc, bias))
    epilogue_vec_kernel<0><<<row_blocks(n), kThreads, 0, stream>>>(out, nullptr, acc, bias, nullptr, n, m);
  else
    bias_kernel<<<row_blocks(n), kThreads, 0, stream>>>(out, acc, bias, n, m);
}

void bias_residual_forward(bf16* out, const float* acc, const float* bias, const bf16* residual, int64_t n, int64_t m,
                           cudaStream_t stream) {
  if (m % 4 == 0 && aligned16(out, acc, bias, residual))
    epilogue_vec_kernel<1><<<row_blocks(n), kThreads, 0, stream>>>(out, nullptr, acc, bias, residual, n, m);
  else
    bias_residual_kernel<<<row_blocks(n), kThreads, 0, stream>>>(out, acc, bias, residual, n, m);
}

void bias_gelu_forward(bf16* h, bf16* g, const float* acc, const float* bias, int64_t n, int64_t m,
                       cudaStream_t stream) {
  if (m % 4 == 0 && aligned16(h, g, acc, bias))
    epilogue_vec_kernel<2><<<row_blocks(n), kThreads, 0, stream>>>(h, g, acc, bias, nullptr, n, m);
  else
    bias_gelu_kernel<<<row_blocks(n), kThreads, 0, stream>>>(h, g, acc, bias, n, m);
}

void gelu_backward(bf16* dh, const bf16* h, const bf16* dg, int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(dh, h, dg))
    gelu_backward_vec_kernel<<<blocks_for(n / 8), kThreads, 0, stream>>>(dh, h, dg, n);
  else
    gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dh, h, dg, n);
}

void cross_entropy(float* losses, bf16* logits, const int32_t* targets, int64_t n, int64_t v, int64_t ldv,
                   float dscale, cudaStream_t stream) {
  if (n == 0) return;
  if (ldv % 8 == 0 && aligned16(logits))
    cross_entropy_vec_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(losses, logits, targets, v, ldv,
                                                                                dscale);
  else
    cross_entropy_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(losses, logits, targets, v, ldv, dscale);
}

void reduce_sum(double* out, const float* x, int64_t n, bool square, double* scratch, cudaStream_t stream) {
  reduce_partial_kernel<<<kReduceBlocks, kThreads, 0, stream>>>(scratch, x, n, square);
  reduce_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch, kReduceBlocks);
}

void adamw(float* p, const float* g, float* m, float* v, bf16* p_bf16, const AdamChunk* chunks, int64_t n_chunks,
           const AdamArgs& args, cudaStream_t stream) {
  if (n_chunks == 0) return;
  adamw_kernel<<<static_cast<unsigned>(n_chunks), kThreads, 0, stream>>>(p, g, m, v, p_bf16, chunks, args);
}

}  // namespace loom::gpu::kern
