// Mixed precision's storage (docs/numerics.md, "Mixed precision"): a block runs in f32 in the
// model's workspace on values already rounded to bf16 or f16, and what it keeps for its
// backward moves to 16-bit tensors in the micro-batch's arena (exactly: they hold 16-bit
// values), and back to f32 in the workspace when its backward starts.
// Internal to nn/. Thread-safety: one thread drives a model.
#pragma once

#include "loom/nn/layers.h"

namespace loom::nn::mixed {

// t's values rounded to `format` in place (kF32: left as they are). REQUIRES: t f32.
void round_values(const Tensor& t, DType format);

// A 16-bit (format kBF16 or kF16) copy of f32 x in arena, rounded to nearest even.
Tensor to_half(const Tensor& x, DType format, Arena& arena);
// An f32 copy of 16-bit x in arena (exact).
Tensor to_f32(const Tensor& x, Arena& arena);
// After a block's forward in the workspace: every tensor ctx keeps moves to the arena, 16-bit
// (its values are rounded already) but the per-row statistics (LayerNorm's mean and rstd,
// the attention's log-sum-exp), which stay f32; those in 16 bits already (c_fc's output
// and its GELU, nn::Linear::forward_gelu) must be in the arena already (Block::forward's
// `kept`), and stay. A tensor kept twice is copied once; `input`
// (the block's input, in the workspace) becomes `input_half`, which the arena holds already.
void keep_half(BlockCtx& ctx, DType format, const Tensor& input, const Tensor& input_half, Arena& arena);
// Before the block's backward: the 16-bit tensors of ctx back to f32 in the workspace, but for
// those the backward reads in 16 bits: the GELU's and the LayerNorms' inputs, the
// attention's qkv and output, and with `linear_bits` the inputs of the Linears, whose weight
// gradients pack them as they are (sequence parallelism gathers them in f32 instead).
void load_f32(BlockCtx& ctx, Arena& workspace, bool linear_bits);

}  // namespace loom::nn::mixed
