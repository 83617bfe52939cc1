// The transformer block (loom/nn/layers.h): causal self-attention, the MLP, and the block
// that joins them with pre-LayerNorms and residuals.
#include <cmath>
#include <tuple>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "loom/core/dtype_dispatch.h"
#include "loom/core/error.h"
#include "loom/nn/layers.h"
#include "loom/nn/step_breakdown.h"
#include "nn/mixed.h"

namespace loom::nn {
namespace k = loom::kernels;

CausalSelfAttention::CausalSelfAttention(ParamSet& ps, const std::string& prefix, int64_t c_,
                                         int64_t n_head_, Shard shard)
    : c_attn(ps, prefix + ".c_attn", c_, 3 * c_, true, shard, TpSplit::kColumn, 3),
      c_proj(ps, prefix + ".c_proj", c_, c_, true, shard, TpSplit::kRow),
      c(c_ / shard.parts),
      n_head(n_head_ / shard.parts) {
  LOOM_CHECK_EQ(c_ % n_head_, 0);
  LOOM_CHECK_EQ(n_head_ % shard.parts, 0);
}

Tensor CausalSelfAttention::forward(const Tensor& x, AttentionCtx& ctx, Arena& arena, Arena* kept) const {
  if (c_attn.shard.sequence_split()) {
    LOOM_CHECK_EQ(ctx.b * ctx.t, x.numel() / x.dim(-1) * c_attn.shard.parts);
  } else {
    LOOM_CHECK_EQ(x.ndim(), 3);
    ctx.b = x.dim(0);
    ctx.t = x.dim(1);
  }
  // Mixed precision keeps qkv and the heads' output in 16 bits: written there by the
  // products and the heads as they finish (nn/mixed.h would convert them afterwards).
  const bool keep_bits = kept != nullptr && precision != DType::kF32 && !c_attn.shard.split();
  if (keep_bits) {  // the heads read qkv's bits and write only their output's (no f32 copy of either)
    ctx.qkv = c_attn.forward_kept(x, ctx.c_attn, arena, *kept);
    ctx.lse = arena.alloc({ctx.b, n_head, ctx.t}, DType::kF32);
    ctx.y = kept->alloc({ctx.b, ctx.t, c}, precision);
    const StepPartScope part(StepPart::kAttentionForward);
    k::attention_forward_bits(ctx.y.data<uint16_t>(), ctx.lse.data<float>(), ctx.qkv.data<uint16_t>(), precision,
                              ctx.b, ctx.t, c, n_head, product_operands(), precision);
    return c_proj.forward(ctx.y, ctx.c_proj, arena);
  }
  const Tensor qkv = ctx.qkv = c_attn.forward(x, ctx.c_attn, arena);
  ctx.lse = arena.alloc({ctx.b, n_head, ctx.t}, qkv.dtype());  // x may be 16-bit bits: qkv is f32 or f64
  ctx.y = arena.alloc({ctx.b, ctx.t, c}, qkv.dtype());         // this part's heads; c_proj keeps it too
  {
    const StepPartScope part(StepPart::kAttentionForward);
    LOOM_DISPATCH_FLOAT(qkv.dtype(), T,
                        k::attention_forward(ctx.y.data<T>(), ctx.lse.data<T>(), qkv.data<T>(), ctx.b, ctx.t, c, n_head,
                                             product_operands(), precision));
  }
  return c_proj.forward(ctx.y, ctx.c_proj, arena);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, AttentionCtx& ctx, Arena& arena,
                                     bool defer_weights) const {
  Tensor datt_out = c_proj.backward(dy, ctx.c_proj, arena, true, defer_weights);
  Tensor dqkv;
  {  // the heads (c_proj and c_attn have scopes of their own)
    const StepPartScope part(StepPart::kAttentionBackward);
    if (ctx.qkv.dtype() != dy.dtype()) {  // qkv and y kept in 16 bits (nn/mixed.h): read as they are
      LOOM_CHECK(ctx.y.dtype() == ctx.qkv.dtype() && dy.dtype() == DType::kF32);
      // dqkv leaves in 16 bits where c_attn's products can take it so (its input kept in 16
      // bits, no split): half the bytes written and read twice, the same values.
      const bool bits = ctx.c_attn.x.dtype() == precision && !c_attn.shard.split();
      dqkv = arena.alloc(ctx.qkv.shape(), bits ? precision : dy.dtype());
      k::attention_backward_bits(bits ? nullptr : dqkv.data<float>(), bits ? dqkv.data<uint16_t>() : nullptr,
                                 datt_out.data<float>(), ctx.qkv.data<uint16_t>(), ctx.y.data<uint16_t>(),
                                 ctx.qkv.dtype(), ctx.lse.data<float>(), ctx.b, ctx.t, c, n_head, product_operands(),
                                 precision);
    } else {
      dqkv = arena.alloc(ctx.qkv.shape(), dy.dtype());
      LOOM_DISPATCH_FLOAT(dy.dtype(), T,
                          k::attention_backward(dqkv.data<T>(), datt_out.data<T>(), ctx.qkv.data<T>(), ctx.y.data<T>(),
                                                ctx.lse.data<T>(), ctx.b, ctx.t, c, n_head, product_operands(),
                                                precision));
    }
  }
  return c_attn.backward(dqkv, ctx.c_attn, arena, true, defer_weights);
}

void CausalSelfAttention::backward_weight(const AttentionCtx& ctx) const {
  c_proj.backward_weight(ctx.c_proj);
  c_attn.backward_weight(ctx.c_attn);
}

Mlp::Mlp(ParamSet& ps, const std::string& prefix, int64_t c, int64_t hidden, Shard shard)
    : c_fc(ps, prefix + ".c_fc", c, hidden, true, shard, TpSplit::kColumn),
      c_proj(ps, prefix + ".c_proj", hidden, c, true, shard, TpSplit::kRow) {}

Tensor Mlp::forward(const Tensor& x, MlpCtx& ctx, Arena& arena, Arena* kept, const Tensor& residual) const {
  // c_fc and the GELU in one pass over h (Linear::forward_gelu): what Gelu::forward would
  // compute, without reading h back from memory.
  auto [h, g] = c_fc.forward_gelu(x, ctx.c_fc, arena, kept);
  ctx.gelu.x = h;
  return c_proj.forward(g, ctx.c_proj, arena, residual);
}

Tensor Mlp::backward(const Tensor& dy, MlpCtx& ctx, Arena& arena, bool defer_weights) const {
  // Mixed precision with c_fc's input and the GELU's kept in 16 bits: the gradient between
  // c_proj and c_fc in 16 bits too, written by c_proj's product as it finishes each tile, so
  // c_fc's products and bias gradient read half the bytes (the same bits: they are rounded).
  if (precision != DType::kF32 && ctx.gelu.x.dtype() == precision && ctx.c_fc.x.dtype() == precision &&
      ctx.c_proj.x.dtype() == precision && !c_fc.shard.sequence_split())
    return c_fc.backward(c_proj.backward_gelu(dy, ctx.c_proj, ctx.gelu.x, arena, defer_weights), ctx.c_fc, arena, true,
                         defer_weights);
  Tensor dh = gelu.backward(c_proj.backward(dy, ctx.c_proj, arena, true, defer_weights), ctx.gelu, arena, precision);
  return c_fc.backward(dh, ctx.c_fc, arena, true, defer_weights);
}

void Mlp::backward_weight(const MlpCtx& ctx) const {
  c_proj.backward_weight(ctx.c_proj);
  c_fc.backward_weight(ctx.c_fc);
}

Block::Block(ParamSet& ps, const std::string& prefix, int64_t c, int64_t n_head, Shard shard)
    : ln_1(ps, prefix + ".ln_1", c, shard),
      attn(ps, prefix + ".attn", c, n_head, shard),
      ln_2(ps, prefix + ".ln_2", c, shard),
      mlp(ps, prefix + ".mlp", c, 4 * c, shard) {}

Tensor Block::forward(const Tensor& x, BlockCtx& ctx, Arena& arena, Arena* kept) const {
  // Mixed precision, unsplit: the LayerNorms' outputs (and ln_2's input) only in 16 bits,
  // where the block keeps them, and c_attn and c_fc pack those bits.
  Arena* ln_kept = precision != DType::kF32 && !attn.c_attn.shard.split() ? kept : nullptr;
  Tensor h = attn.forward(ln_1.forward(x, ctx.ln_1, arena, ln_kept), ctx.attn, arena, kept);
  // h = x + attn(ln_1(x)), and ln_2 of it, in one pass over the rows
  // y = h + mlp(ln_2(h)), the residual added by c_proj's product as it finishes each tile
  return mlp.forward(ln_2.forward_add(h, x, ctx.ln_2, arena, ln_kept), ctx.mlp, arena, kept, h);
}

Tensor Block::backward(const Tensor& dy, BlockCtx& ctx, Arena& arena, bool defer_weights) const {
  // Each LayerNorm's gradient with the residual's added to its rows as they are written.
  Tensor dh = ln_2.backward(mlp.backward(dy, ctx.mlp, arena, defer_weights), ctx.ln_2, arena, dy);
  return ln_1.backward(attn.backward(dh, ctx.attn, arena, defer_weights), ctx.ln_1, arena, dh);
}

void Block::set_precision(DType format) {
  LOOM_CHECK(format == DType::kF32 || ((format == DType::kBF16 || format == DType::kF16) &&
                                       ln_1.weight.value().dtype() == DType::kF32));
  precision = ln_1.precision = ln_2.precision = attn.precision = mlp.precision = format;
  attn.c_attn.precision = attn.c_proj.precision = mlp.c_fc.precision = mlp.c_proj.precision = format;
}

void Block::backward_weight(const BlockCtx& ctx) const {
  mlp.backward_weight(ctx.mlp);
  attn.backward_weight(ctx.attn);
}

}  // namespace loom::nn
