// Loom's own CUDA kernels for a GPT step (docs/gpu.md, "Kernels"): host-callable launchers,
// each enqueued on `stream`. bf16 tensors are passed as uint16_t (an f32's high 16 bits,
// rounded to nearest even), so that this header compiles with any host compiler.
// Legend: N rows (B x T tokens), C channels, M output columns, V vocabulary (ldv its row
// stride, >= V), B batch, T time, NH heads, HS = C / NH head size.
//
// Every reduction adds in an order fixed by the shapes alone (no atomics): the same inputs
// give the same bits on every run (docs/gpu.md, "Determinism").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::gpu::kern {

using bf16 = uint16_t;

// out (n) = round_bf16(in (n)).
void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);
// out (n) = float(in (n)), exact.
void widen_bf16(float* out, const bf16* in, int64_t n, cudaStream_t stream);

// x (N, C) = round(wte[tokens[n]] + wpe[n % T]); tokens (N) i32.
void embedding_forward(bf16* x, const int32_t* tokens, const float* wte, const float* wpe, int64_t n, int64_t t,
                       int64_t c, cudaStream_t stream);
// dwpe (T, C) += sum over the batch of dx (B, T, C).
void wpe_backward(float* dwpe, const bf16* dx, int64_t b, int64_t t, int64_t c, cudaStream_t stream);
// dwte[ids[i]] += sum of dx's rows rows[starts[i] .. starts[i + 1]) in that order, for the
// n_ids distinct token ids of a batch (built on the host, so no two blocks add to one row).
void wte_backward(float* dwte, const bf16* dx, const int32_t* rows, const int32_t* starts, const int32_t* ids,
                  int64_t n_ids, int64_t c, cudaStream_t stream);

// out (N, C) = round(LayerNorm(x) * w + b), with mean and rstd (N) f32 kept for backward.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const float* w, const float* b, int64_t n,
                       int64_t c, cudaStream_t stream);
// Rows per block of layernorm_backward: its weight and bias gradients come as one partial
// sum per block, (ceil(N / kLnRows), C) each, for add_partials.
constexpr int64_t kLnRows = 32;
inline int64_t layernorm_partials(int64_t n) { return (n + kLnRows - 1) / kLnRows; }
// dx (N, C) = round(LayerNorm'(x)^T dy + dres) (dres may be null); dw_part and db_part
// (layernorm_partials(N), C) receive the blocks' sums of dy * xhat and dy. REQUIRES: C <= 4096.
void layernorm_backward(bf16* dx, float* dw_part, float* db_part, const bf16* dy, const bf16* x, const float* mean,
                        const float* rstd, const float* w, const bf16* dres, int64_t n, int64_t c,
                        cudaStream_t stream);
// dst (M) += the sum of parts (P, M) over P, in order.
void add_partials(float* dst, const float* parts, int64_t p, int64_t m, cudaStream_t stream);
// dst (n) += src (n).
void add(float* dst, const float* src, int64_t n, cudaStream_t stream);
// Row chunks of column_sums: parts (column_sum_parts(N), M).
constexpr int64_t kColRows = 256;
inline int64_t column_sum_parts(int64_t n) { return (n + kColRows - 1) / kColRows; }
// parts (column_sum_parts(N), M): each chunk of kColRows rows of y (N, M) summed by column.
void column_sums(float* parts, const bf16* y, int64_t n, int64_t m, cudaStream_t stream);

// GEMM epilogues over acc (N, M) f32 and bias (M) f32:
// out = round(acc + bias)
void bias_forward(bf16* out, const float* acc, const float* bias, int64_t n, int64_t m, cudaStream_t stream);
// out = round(residual + round(acc + bias)); out may alias residual.
void bias_residual_forward(bf16* out, const float* acc, const float* bias, const bf16* residual, int64_t n, int64_t m,
                           cudaStream_t stream);
// h = round(acc + bias), g = round(gelu(h)) (tanh form, as GPT-2).
void bias_gelu_forward(bf16* h, bf16* g, const float* acc, const float* bias, int64_t n, int64_t m,
                       cudaStream_t stream);
// dh (n) = round(gelu'(h) * dg); dh may alias dg.
void gelu_backward(bf16* dh, const bf16* h, const bf16* dg, int64_t n, cudaStream_t stream);

// Softmax cross-entropy over logits (N, ldv) bf16, the first V columns of each row:
// losses (N) f32 = logsumexp - logit[target], and the logits overwritten by their gradient
// round((softmax - onehot(target)) * dscale); columns V..ldv set to 0. REQUIRES: targets in [0, V).
void cross_entropy(float* losses, bf16* logits, const int32_t* targets, int64_t n, int64_t v, int64_t ldv,
                   float dscale, cudaStream_t stream);

// out[0] = the sum of x (n) (of x^2 when square), in double, in a fixed order. scratch: at
// least kReduceBlocks doubles.
constexpr int kReduceBlocks = 264;
void reduce_sum(double* out, const float* x, int64_t n, bool square, double* scratch, cudaStream_t stream);

// AdamW over a flat buffer in chunks (PyTorch's torch.optim.AdamW semantics, as
// loom::kernels::adamw_update): each chunk [begin, begin + len) with or without weight decay;
// the gradient is multiplied by grad_scale (clipping) first; p_bf16 gets round(p) after.
struct AdamChunk {
  int64_t begin;
  int32_t len;
  int32_t decay;
};
struct AdamArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float bias1, bias2_sqrt;  // 1 - beta1^t and sqrt(1 - beta2^t)
  float grad_scale;
  int64_t state_offset;  // m and v hold elements [state_offset, ...) of p and g (a ZeRO shard)
};
constexpr int32_t kAdamChunk = 8192;
void adamw(float* p, const float* g, float* m, float* v, bf16* p_bf16, const AdamChunk* chunks, int64_t n_chunks,
           const AdamArgs& args, cudaStream_t stream);

// Causal self-attention with an online softmax, no (T, T) matrix (attention.cu): qkv
// (N, 3C) rows [q | k | v] (GPT-2 order) bf16; y (N, C) bf16; lse (B, NH, T) f32 the
// log-sum-exp of each row's scaled scores. Products on tensor cores (bf16 in, f32
// accumulation); probabilities rounded to bf16 before they multiply v. REQUIRES: HS 32 or 64.
// Two implementations of the same roundings: kMma (attention_mma.cu, mma.sync with the
// scores in registers, FlashAttention-2's layout; sm_80 and later) and kWmma (WMMA
// fragments through shared memory); they add in other orders. kMmaX4 is kMma with the
// scores' B fragments loaded by ldmatrix.x4 and the dk/dv kernel held to 168 registers, three
// blocks an SM where kMma's 197 allow two: the same products in the same order, so kMma's bits.
enum class AttentionKernels { kMma, kWmma, kMmaX4 };
void attention_forward(bf16* y, float* lse, const bf16* qkv, int64_t b, int64_t t, int64_t c, int64_t nh,
                       cudaStream_t stream, AttentionKernels kernels = AttentionKernels::kMma);
// dqkv (N, 3C) from dy (N, C) and the forward's qkv, y and lse; dpre (B, NH, T) f32 scratch
// (rowsum(dy * y)). Deterministic: one kernel for dk, dv by key blocks, one for dq by query blocks.
void attention_backward(bf16* dqkv, float* dpre, const bf16* dy, const bf16* qkv, const bf16* y, const float* lse,
                        int64_t b, int64_t t, int64_t c, int64_t nh, cudaStream_t stream,
                        AttentionKernels kernels = AttentionKernels::kMma);
// attention_mma.cu's launchers (dpre already computed); x4: kMmaX4's kernels.
void attention_forward_mma(bf16* y, float* lse, const bf16* qkv, int64_t b, int64_t t, int64_t c, int64_t nh,
                           cudaStream_t stream, bool x4);
void attention_backward_mma(bf16* dqkv, const float* dpre, const bf16* dy, const bf16* qkv, const float* lse,
                            int64_t b, int64_t t, int64_t c, int64_t nh, cudaStream_t stream, bool x4);
bool attention_head_size_supported(int64_t hs);

}  // namespace loom::gpu::kern
