// Matrix multiply with bias: the fully connected layers and the tied output projection.
// Dimension legend: N rows (batch x time), K input features, M output features.
// Fast version: Loom's GEMM (kernels/gemm/gemm.h), threaded by the process's one OpenMP
// pool over output tiles, so the bits do not depend on the thread count.
// Thread-safety: reentrant; callers inside an OpenMP region get a single-threaded GEMM.
#pragma once

#include <cstdint>

#include "kernels/gemm/gemm.h"

namespace loom::kernels {

// How the weight is laid out: kKM = (K, M), as GPT-2's Conv1D (x @ W);
// kMK = (M, K), as an embedding table used as the output projection (x @ W^T).
enum class WeightLayout { kKM, kMK };

// out (N, M) = inp (N, K) @ weight + bias (M). bias may be null. gelu_out (N, M), when not
// null: gelu(out), fused: computed on each tile of out as the GEMM finishes it, while it is
// in cache (the same bits as gelu_forward over out after). `operands` kBF16 or kF16 (f32
// only): the products read inp and weight as that format holds them (gemm_half), with the
// weight rounded as it is packed, so no rounded copy of it is made. `round_out` kBF16 or
// kF16 (f32 only): out is rounded to it tile by tile, and gelu_out is the GELU of the
// rounded out, rounded too (the bits of round_to over out, gelu_forward, round_to after).
// With `residual` (N, M), out + residual, rounded to round_out, where out would be (a block's
// residual stream: the bits of add_round, or add_forward, over out after).
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t k,
                    int64_t m, WeightLayout layout, T* gelu_out = nullptr, DType operands = DType::kF32,
                    DType round_out = DType::kF32, const T* residual = nullptr);

// Mixed precision's forward product: matmul_forward (layout kKM) with operands and round_out
// `format` (kBF16 or kF16) on inp given as f32 values or as the format's bits (inp_bits, as
// store_half writes them; exactly one of the two); with out_bits (N, M), when not null,
// out's bits too, and with gelu_bits (N, M) the GELU in the format's bits: the bits
// store_half would write of out and of matmul_forward's gelu_out. So a Linear's 16-bit
// input and c_fc's GELU are never f32 tensors, and what backward keeps of c_fc is written
// while each tile is in cache. With out_scratch only out_bits and gelu_bits are wanted: out
// is space the product may use or leave alone (GemmEpilogue::scratch), its contents
// unspecified after. `residual` as matmul_forward's (not with out_scratch).
void matmul_forward_half(float* out, uint16_t* out_bits, uint16_t* gelu_bits, const float* inp,
                         const uint16_t* inp_bits, const float* weight, const float* bias, int64_t n, int64_t k,
                         int64_t m, DType format, bool out_scratch = false, const float* residual = nullptr);

// matmul_forward with the weight laid out in panels once (gemm.h, PanelMatrix: (K, M) as
// op(B), from either layout): the same bits.
void matmul_forward_panels(float* out, const float* inp, const PanelMatrix& weight, const float* bias, int64_t n,
                           float* gelu_out = nullptr);

// dinp (N, K) = dout @ weight^T (overwritten; skipped when null);
// dweight += inp^T @ dout in the weight's layout (skipped when null); dbias (M) += column sums
// of dout (skipped when null). Zero-bubble pipelines call it twice, dinp first and the rest
// later: the same bits as one call. Sums are in a fixed order, so results are deterministic
// run to run. `operands` as matmul_forward's (dbias sums dout's values as they are).
// `round_dinp` kBF16 or kF16 (f32 only): dinp rounded to it tile by tile as the product
// finishes each (the bits of round_to over dinp after).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t n, int64_t k, int64_t m, WeightLayout layout, DType operands = DType::kF32,
                     DType round_dinp = DType::kF32);

// dweight (K, M) += inp^T @ dout (layout kKM) and, unless null, dbias (M) += dout's column
// sums, with inp held in 16-bit storage (format kBF16 or kF16: its bits, as mixed precision
// keeps a Linear's input) and dout f32 values or (Dout uint16_t) the format's bits too, the
// products reading dout as `format` holds it: the bits of matmul_backward on their f32
// values. Instantiated for Dout float and uint16_t.
template <typename Dout>
void matmul_weight_grad_bits(float* dweight, float* dbias, const Dout* dout, const uint16_t* inp, DType format,
                             int64_t n, int64_t k, int64_t m);

// Mixed precision's gradients in 16 bits (format kBF16 or kF16), between the MLP's products:
// - matmul_backward_gelu_bits: dinp (N, K) = dout @ weight^T (layout kKM) rounded to
//   `format`, as matmul_backward computes it (operands and round_dinp `format`), then, on each
//   tile as the product finishes it, dh_bits = gelu'(h) * dinp rounded, in the format's bits,
//   h given as its bits (the GELU's input): the bits of matmul_backward, gelu_backward_bits
//   and store_half after; dinp is space the product may use (GemmEpilogue::scratch), its
//   contents unspecified after.
// - matmul_dinp_bits: matmul_backward's dinp (layout kKM, operands `format`) of a dout held
//   as the format's bits, rounded to round_dinp.
void matmul_backward_gelu_bits(uint16_t* dh_bits, float* dinp, const float* dout, const float* weight,
                               const uint16_t* h_bits, int64_t n, int64_t k, int64_t m, DType format);
void matmul_dinp_bits(float* dinp, const uint16_t* dout, const float* weight, int64_t n, int64_t k, int64_t m,
                      DType format, DType round_dinp);
}  // namespace loom::kernels
