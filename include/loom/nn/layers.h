// Layers with explicit forward and backward passes (DESIGN.md section 3).
//
// A layer owns references to its parameters (views into a model's ParamSet) and no state
// of its own between calls: forward(x, ctx, arena) saves what backward needs in a
// per-micro-batch context `ctx`, and allocates its outputs from `arena` (the activation
// buffer of that micro-batch). backward(dy, ctx, arena) returns dx and accumulates (+=)
// the parameter gradients. Many contexts may be in flight at once (pipelining).
//
// Every layer works in the dtype of its ParamSet: f32 for training, f64 for the
// finite-difference gradient checks. Mixed precision (docs/numerics.md): a layer whose
// `precision` is kBF16 or kF16 rounds what it writes (outputs forward, input gradients
// backward) to that format's values, and multiplies by its weights rounded to it; its
// arithmetic and its parameters' gradients stay f32. kF32: no rounding. Tensor shapes are in comments; leading dimensions
// are flattened into N rows. Legend: N rows, B batch, T time, C channels, V vocabulary.
//
// Layers know nothing of parallelism (STYLE.md rule 14) beyond the seam tensor parallelism
// cuts them at (loom/nn/shard.h): where a split layer's pieces meet, never how.
// Thread-safety: forward/backward on distinct contexts may run concurrently only if they
// write distinct gradients; the normal use is one thread per model replica.
#pragma once

#include <string>

#include "loom/nn/shard.h"
#include "loom/core/params.h"
#include "loom/core/tensor.h"

namespace loom::kernels {
struct Int8Weight;   // kernels/int8_matmul.h
struct PanelMatrix;  // kernels/gemm/gemm.h
}

namespace loom::nn {

struct LinearCtx {
  Tensor x;
  Tensor dy;  // kept by a backward that defers the weight gradients
};

// How a Linear is split by tensor parallelism (Megatron): column-parallel holds out/parts of
// the outputs (of each of `groups` blocks, e.g. the fused q, k, v) and sums dx over the
// parts in backward; row-parallel holds in/parts of the inputs, sums y over the parts in
// forward, then adds the replicated bias.
enum class TpSplit : uint8_t { kNone, kColumn, kRow };

// y = x @ W + b, W (in, out) as GPT-2's Conv1D, so Hugging Face checkpoints load as is.
class Linear {
 public:
  Linear() = default;
  // in, out: the logical sizes; the parameters hold this part's piece.
  Linear(ParamSet& ps, const std::string& prefix, int64_t in, int64_t out, bool bias = true, Shard shard = {},
         TpSplit split = TpSplit::kNone, int groups = 1);
  // (N, in) -> (N, out); x f32, or (mixed precision, unsplit) 16-bit bits of the precision.
  // With a defined `residual` (N, out; a block's residual stream): residual + the output,
  // rounded to the precision, the bits of add_into after; added by the product's epilogue as
  // each tile is finished where the output is final there (not a row-parallel piece).
  Tensor forward(const Tensor& x, LinearCtx& ctx, Arena& arena, const Tensor& residual = Tensor()) const;
  // Mixed precision, unsplit: forward's output as 16-bit bits only, written into `kept` as
  // each tile is finished (what store_half would write of it; the f32 output is the
  // product's scratch, in `arena`). x f32 or the precision's bits.
  Tensor forward_kept(const Tensor& x, LinearCtx& ctx, Arena& arena, Arena& kept) const;
  // The same, and gelu of the output fused into the matrix product (computed on each tile
  // as it is finished, allocated after the output): {y, gelu(y)}, the same bits as
  // Gelu::forward on y. Falls back to two passes where the output is not final in the
  // product (a row-parallel piece, sequence parallelism). Mixed precision (unsplit): the
  // GELU in the precision's 16 bits (the bits store_half would write of Gelu::forward's),
  // which forward reads as they are; with `kept` (where a block keeps its 16-bit tensors,
  // nn/mixed.h) the GELU there, and y too, returned in 16 bits (the f32 y, the product's
  // output, stays in `arena`).
  std::pair<Tensor, Tensor> forward_gelu(const Tensor& x, LinearCtx& ctx, Arena& arena, Arena* kept = nullptr) const;
  // Returns dx (N, in), or an undefined tensor when need_dx is false. With defer_weights,
  // only dx: dy is kept in ctx and backward_weight adds the weight and bias gradients later
  // (zero-bubble pipelines), the same bits as one backward.
  // Mixed precision: dy may be 16-bit (the precision's bits, with x kept so too; from
  // backward_gelu), dx then f32.
  Tensor backward(const Tensor& dy, LinearCtx& ctx, Arena& arena, bool need_dx = true, bool defer_weights = false) const;
  // Mixed precision's MLP (c_proj, unsplit or row-parallel, its input kept in 16 bits): dx
  // taken on through the GELU whose input h is kept in the precision's bits, gelu'(h) * dx
  // in those bits (kernels::matmul_backward_gelu_bits: the bits of backward, Gelu::backward
  // rounding to the precision, and store_half), which c_fc's backward packs as they are.
  Tensor backward_gelu(const Tensor& dy, LinearCtx& ctx, const Tensor& h, Arena& arena, bool defer_weights = false) const;
  void backward_weight(const LinearCtx& ctx) const;

  ParamRef weight;  // (in, out)
  ParamRef bias;    // (out), or undefined
  int64_t in = 0, out = 0;  // this part's
  // Inference with int8 weights (Gpt::use_int8): forward multiplies by these in place of
  // `weight`; backward refuses. Owned by the model.
  const kernels::Int8Weight* int8 = nullptr;
  // Inference with the weight in panels (Gpt::use_panels): forward multiplies by these in
  // place of `weight`, the same bits; backward refuses. Owned by the model.
  const kernels::PanelMatrix* panels = nullptr;
  Shard shard;
  TpSplit split = TpSplit::kNone;
  // Mixed precision: the products read the input and the weight as this format holds
  // them (kernels::gemm_half; the weight is rounded as it is packed), and the output and
  // input gradient are rounded to it.
  DType precision = DType::kF32;

 private:
  // Sequence parallelism (shard.sequence): a column-parallel layer takes this part's rows
  // (m, in) and gives every row of its columns; a row-parallel layer takes every row and
  // gives this part's rows (m, out).
  Tensor forward_sequence(const Tensor& x, LinearCtx& ctx, Arena& arena) const;
  Tensor backward_sequence(const Tensor& dy, LinearCtx& ctx, Arena& arena) const;
};

struct LayerNormCtx {
  Tensor x, mean, rstd;
};

class LayerNorm {
 public:
  LayerNorm() = default;
  // shard.sequence: each part normalizes its own rows, so its parameter gradients are its
  // rows' share; backward sums them over the parts before adding them in.
  LayerNorm(ParamSet& ps, const std::string& prefix, int64_t c, Shard shard = {});
  // (N, C) -> (N, C). Mixed precision with `kept` (where a block keeps its 16-bit tensors):
  // the output is written there only in 16 bits, which the next Linear packs as they are.
  Tensor forward(const Tensor& x, LayerNormCtx& ctx, Arena& arena, Arena* kept = nullptr) const;
  // x += residual (in place: the residual stream), then forward(x), in one pass over the
  // rows: the same bits as the add and forward apart. An undefined residual: forward(x).
  // With `kept`, the sum's 16-bit bits go there too, and ctx keeps those.
  Tensor forward_add(const Tensor& x, const Tensor& residual, LayerNormCtx& ctx, Arena& arena,
                     Arena* kept = nullptr) const;
  // With a defined `residual` (N, C; the gradient of a block's residual stream): dx +
  // residual, rounded to the precision, each row while it is in cache (the bits of add_into
  // after).
  Tensor backward(const Tensor& dy, const LayerNormCtx& ctx, Arena& arena, const Tensor& residual = Tensor()) const;

  ParamRef weight, bias;  // (C)
  int64_t c = 0;
  Shard shard;
  DType precision = DType::kF32;  // forward_add also rounds the residual sum it writes into x
};

struct GeluCtx {
  Tensor x;
};

// GELU, tanh approximation (as GPT-2).
class Gelu {
 public:
  Tensor forward(const Tensor& x, GeluCtx& ctx, Arena& arena) const;
  // dx rounded to round_out (kF32: as computed). ctx.x may be kept in 16 bits (mixed precision).
  Tensor backward(const Tensor& dy, const GeluCtx& ctx, Arena& arena, DType round_out = DType::kF32) const;
};

struct EmbeddingCtx {
  Tensor ids;  // (N) i32
};

class Embedding {
 public:
  Embedding() = default;
  // rows: the logical table's. Split over shard.parts (vocab-parallel): each part holds
  // rows / parts consecutive rows, looks up the ids it holds, and the parts' outputs are
  // summed (each id's row comes from the one part that holds it).
  Embedding(ParamSet& ps, const std::string& name, int64_t rows, int64_t c, Shard shard = {});
  // ids (N) i32 with 0 <= id < rows (logical) -> (N, C); with shard.sequence, this part's
  // rows of it (N / parts, C): the parts' lookups are summed and scattered by rows.
  Tensor forward(const Tensor& ids, EmbeddingCtx& ctx, Arena& arena) const;
  // Only accumulates dtable. dy: (N, C), every row (with shard.sequence too).
  void backward(const Tensor& dy, const EmbeddingCtx& ctx) const;

  ParamRef table;  // (rows, C): this part's rows
  int64_t rows = 0, c = 0;  // this part's
  // Inference with an int8 table (Gpt::use_int8): a row is its int8 values times its scale.
  const kernels::Int8Weight* int8 = nullptr;
  // Inference with the tied head's panels (Gpt::use_panels): row t is their column t, and
  // the table itself is given back.
  const kernels::PanelMatrix* panels = nullptr;
  Shard shard;
};

// Mean softmax cross-entropy over rows. forward returns the mean loss; backward returns
// dlogits of (mean loss x scale), written over the logits, which it consumes.
// Knowledge distillation (kernels/distill.h, docs/numerics.md): with `soft` set, the loss is
// (1 - alpha) x cross-entropy + alpha x temperature^2 x KL(soft || softmax(logits / temperature)).
struct DistillTargets {
  Tensor soft;  // (N, V / parts): a teacher's softmax at `temperature`, this part's columns; undefined: none
  double alpha = 0, temperature = 1;
};

struct CrossEntropyCtx {
  Tensor logits, targets;
  // vocab-parallel: (3, N) each row's max, sum of exponentials and target logit over every
  // part; distilling (any layout), (6, N): those, then distill_slice_sums' three.
  Tensor stats;
  DistillTargets distill;  // set by the caller before forward; forward and backward only read it
};
class CrossEntropy {
 public:
  // vocab: split over vocab.parts, each part holds V / parts consecutive columns of the
  // logits (no part ever holds a whole row); the parts combine each row's max, sum of
  // exponentials and target logit (a max and one sum per forward, nothing in backward).
  explicit CrossEntropy(Shard vocab = {}) : vocab(vocab) {}
  // logits (N, V) (a vocab-parallel part's columns: (N, V / parts)), targets (N) i32 (< V)
  double forward(const Tensor& logits, const Tensor& targets, CrossEntropyCtx& ctx, Arena& arena) const;
  Tensor backward(const CrossEntropyCtx& ctx, double scale) const;

  Shard vocab;
};

struct AttentionCtx {
  LinearCtx c_attn, c_proj;
  // qkv, the heads' output y and each row's log-sum-exp of its scores (B, NH, T): all the
  // attention's backward needs, which recomputes the probabilities block by block.
  Tensor qkv, y, lse;
  int64_t b = 0, t = 0;  // with sequence parallelism set by the caller (x holds only some rows)
};

// Causal multi-head self-attention with GPT-2's fused c_attn (C -> 3C) and c_proj.
class CausalSelfAttention {
 public:
  CausalSelfAttention() = default;
  // Heads split over shard.parts: c_attn column-parallel per q, k and v, c_proj row-parallel.
  CausalSelfAttention(ParamSet& ps, const std::string& prefix, int64_t c, int64_t n_head, Shard shard = {});
  // (B, T, C); with sequence parallelism this part's rows (B x T / parts, C), ctx.b and
  // ctx.t set.
  // Mixed precision, unsplit, with `kept` (where a block keeps its 16-bit tensors): qkv and
  // the heads' output are written there in 16 bits as they are computed (ctx holds those),
  // and c_proj reads the output's bits.
  Tensor forward(const Tensor& x, AttentionCtx& ctx, Arena& arena, Arena* kept = nullptr) const;
  Tensor backward(const Tensor& dy, AttentionCtx& ctx, Arena& arena, bool defer_weights = false) const;
  void backward_weight(const AttentionCtx& ctx) const;

  Linear c_attn, c_proj;
  int64_t c = 0, n_head = 0;  // this part's width (n_head x head size) and heads
  DType precision = DType::kF32;  // of the heads' output and of d(qkv)

 private:
  // What the attention's products read: bf16 values under bf16 (vdpbf16ps where the CPU
  // has it: the probabilities and score gradients rounded first), f32 otherwise. f16 has no
  // product instruction here, so rounding them would only cost (docs/numerics.md).
  DType product_operands() const { return precision == DType::kBF16 ? precision : DType::kF32; }
};

struct MlpCtx {
  LinearCtx c_fc, c_proj;
  GeluCtx gelu;
};

// The transformer's feed-forward: C -> hidden -> C with GELU (hidden = 4C in GPT-2).
class Mlp {
 public:
  Mlp() = default;
  // Split over shard.parts: c_fc column-parallel, c_proj row-parallel.
  Mlp(ParamSet& ps, const std::string& prefix, int64_t c, int64_t hidden, Shard shard = {});
  // `kept`: Linear::forward_gelu's. `residual`: c_proj's (Linear::forward).
  Tensor forward(const Tensor& x, MlpCtx& ctx, Arena& arena, Arena* kept = nullptr,
                 const Tensor& residual = Tensor()) const;
  Tensor backward(const Tensor& dy, MlpCtx& ctx, Arena& arena, bool defer_weights = false) const;
  void backward_weight(const MlpCtx& ctx) const;

  Linear c_fc, c_proj;
  Gelu gelu;
  DType precision = DType::kF32;  // of GELU's output and its input gradient
};

// Mixed precision moves every tensor a block keeps to 16 bits and back by the list in
// src/nn/mixed.cc (for_each_kept): a tensor added to these contexts goes there too.
struct BlockCtx {
  Tensor input;  // full recompute: the block's input, the only activation it keeps
  LayerNormCtx ln_1, ln_2;
  AttentionCtx attn;
  MlpCtx mlp;
};

// Pre-LayerNorm transformer block: h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)).
class Block {
 public:
  Block() = default;
  Block(ParamSet& ps, const std::string& prefix, int64_t c, int64_t n_head, Shard shard = {});
  // (B, T, C). Mixed precision: `kept`, when not null, takes the 16-bit tensors the MLP
  // writes for backward (Linear::forward_gelu), so they need no copy (nn/mixed.h).
  Tensor forward(const Tensor& x, BlockCtx& ctx, Arena& arena, Arena* kept = nullptr) const;
  // With defer_weights: dx and the LayerNorm gradients now, the linear layers' weight
  // gradients in backward_weight (zero-bubble pipelines).
  Tensor backward(const Tensor& dy, BlockCtx& ctx, Arena& arena, bool defer_weights = false) const;
  void backward_weight(const BlockCtx& ctx) const;
  // Mixed precision for the block and every layer in it (kF32: none). REQUIRES: f32 parameters.
  void set_precision(DType format);

  // Declared in Hugging Face order, which is also the parameters' registration order.
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  Mlp mlp;
  DType precision = DType::kF32;  // of the residual sums
};

}  // namespace loom::nn
