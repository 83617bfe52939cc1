// Causal multi-head self-attention core (after the qkv projection, before the output one).
// Legend: B batch, T time, C channels, NH heads, HS = C / NH head size.
// qkv rows hold [q | k | v], each C wide, head h at columns [h*HS, (h+1)*HS) (GPT-2 order).
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels {

// out (B, T, C): softmax(q k^T / sqrt(HS), causal) v per head, by blocks with an online
// softmax: no (T, T) score matrix exists, only a 32 x 256 block per thread. lse (B, NH, T)
// receives each row's log-sum-exp of its scaled scores, which backward needs. `operands`
// kBF16 or kF16 (f32 only): every product reads its operands as that format holds them
// (gemm_half), so the probabilities are rounded before they multiply v (and, in backward,
// the score gradients before they multiply q and k); the softmax stays f32. round_out kBF16
// or kF16 (T float): out rounded to that format as each row is finished (mixed precision's
// activations), and with out_bits its bits written there too (B, T, C).
// out may be null where out_bits is given: only the bits are written then.
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh,
                       DType operands = DType::kF32, DType round_out = DType::kF32, uint16_t* out_bits = nullptr);
// The same with qkv held in 16 bits (`format`'s bits) and the output's bits only (round_out
// == format): where the products read `format` (operands == format) on Loom's backend,
// each head's keys and values are packed, and each row block's queries multiplied, from
// their bits as they are (PackedB::pack and gemm_packed_b on bits); elsewhere they are loaded
// into the thread's cache as f32 values first. Either way the bits are attention_forward's
// on qkv's f32 values, without an f32 copy of qkv or of the output.
void attention_forward_bits(uint16_t* out_bits, float* lse, const uint16_t* qkv, DType format, int64_t b, int64_t t,
                            int64_t c, int64_t nh, DType operands, DType round_out);
// dqkv (B, T, 3C) overwritten, from dout, and the forward's qkv, out and lse: the
// probabilities are recomputed block by block. round_out: dqkv rounded as each head is
// finished, as attention_forward's.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int64_t b, int64_t t,
                        int64_t c, int64_t nh, DType operands = DType::kF32, DType round_out = DType::kF32);
// The same with qkv and out held in 16 bits (`format`'s bits, as mixed precision keeps them
// for backward): where the products read `format` on Loom's backend, each head's q, k and
// v are packed and multiplied from their bits and y read from its bits; elsewhere each
// head's values are loaded into the thread's cache as it starts. The bits are
// attention_backward's on their f32 values, without a pass that loads them all.
// Exactly one of dqkv and dqkv_bits: with dqkv_bits (round_out == format) dqkv's values go
// there as the format's bits (store_half's), each head's sums made in the thread's cache.
void attention_backward_bits(float* dqkv, uint16_t* dqkv_bits, const float* dout, const uint16_t* qkv,
                             const uint16_t* out, DType format, const float* lse, int64_t b, int64_t t, int64_t c,
                             int64_t nh, DType operands, DType round_out);

// Incremental decoding with a key/value cache (docs/serving.md): n new tokens at positions
// past..past+n-1 of one sequence. q: their query rows (n, C) with row stride ldq (the q
// columns of c_attn's output); every position's keys and values so far, the new ones
// included, in pages of `page` rows (C apart): position p's key row at kpages[p / page] +
// (p % page) C, its value row likewise in vpages. out (n, C): row i attends to positions
// 0..past+i. scratch: nh x (past + n) elements per thread.
template <typename T>
void attention_decode(T* out, const T* q, int64_t ldq, const T* const* kpages, const T* const* vpages, int64_t page,
                      int64_t past, int64_t n, int64_t c, int64_t nh);
// The same with the keys and values kept in bf16 (an f32's high 16 bits; a KvPagePool of
// kBF16): each is widened to f32, exactly, as it is read, so the result has the bits of the
// f32 overload given those widened values.
void attention_decode(float* out, const float* q, int64_t ldq, const uint16_t* const* kpages,
                      const uint16_t* const* vpages, int64_t page, int64_t past, int64_t n, int64_t c, int64_t nh);

}  // namespace loom::kernels
