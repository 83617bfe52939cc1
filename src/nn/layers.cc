#include "loom/nn/layers.h"

#include <cmath>

#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/distill.h"
#include "kernels/embedding.h"
#include "kernels/int8_matmul.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "loom/core/dtype_dispatch.h"
#include "loom/nn/step_breakdown.h"
#include "nn/mixed.h"
#include "nn/residual.h"

namespace loom::nn {
namespace k = loom::kernels;
using mixed::round_values;

namespace {
// The shape of x with its last dimension replaced.
Shape with_last(const Tensor& x, int64_t last) {
  Shape s = x.shape();
  s.back() = last;
  return s;
}
}  // namespace

Linear::Linear(ParamSet& ps, const std::string& prefix, int64_t in_, int64_t out_, bool has_bias, Shard shard_,
               TpSplit split_, int groups)
    : in(in_), out(out_), shard(shard_), split(shard_.split() ? split_ : TpSplit::kNone) {
  ParamSplit w, b;
  if (split == TpSplit::kColumn) {
    LOOM_CHECK_EQ(out % (groups * shard.parts), 0);
    out /= shard.parts;
    w = {.dim = 1, .groups = groups, .index = shard.index, .parts = shard.parts};
    b = {.dim = 0, .groups = groups, .index = shard.index, .parts = shard.parts};
  } else if (split == TpSplit::kRow) {
    LOOM_CHECK_EQ(in % shard.parts, 0);
    in /= shard.parts;
    w = {.dim = 0, .index = shard.index, .parts = shard.parts};  // the bias stays whole
  }
  LOOM_CHECK(split == TpSplit::kNone || shard.seam != nullptr);
  weight = ps.add(prefix + ".weight", {in, out}, ParamKind::kWeight, w);
  if (has_bias) bias = ps.add(prefix + ".bias", {out}, ParamKind::kBias, b);
}

namespace {
// x (rows, cols) += bias (cols) on every row.
void add_bias(const Tensor& x, const Tensor& bias) {
  const int64_t cols = bias.numel(), rows = x.numel() / cols;
  LOOM_DISPATCH_FLOAT(x.dtype(), T, {
    T* xd = x.data<T>();
    const T* bd = bias.data<T>();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) xd[i * cols + j] += bd[j];
  });
}

// Every part's rows of `local` (m, cols) gathered into a (parts x m, cols) temporary of the
// seam's staging buffer.
Tensor gather_rows(const Shard& shard, const Tensor& local) {
  const int64_t cols = local.dim(-1);
  Tensor whole = shard.seam->staging().alloc({local.numel() / cols * shard.parts, cols}, local.dtype());
  shard.seam->all_gather(local, whole);
  return whole;
}

// The parts' `whole` (parts x m, cols) summed; this part's m rows into the arena.
Tensor scatter_rows(const Shard& shard, const Tensor& whole, Arena& arena) {
  const int64_t cols = whole.dim(-1);
  Tensor local = arena.alloc({whole.numel() / cols / shard.parts, cols}, whole.dtype());
  shard.seam->reduce_scatter(whole, local);
  return local;
}
}  // namespace

Tensor Linear::forward_sequence(const Tensor& x, LinearCtx& ctx, Arena& arena) const {
  const StepPartScope part(StepPart::kLinearForward);
  shard.seam->staging().reset();
  ctx.x = x;  // column: this part's rows (gathered again in backward); row: every row
  const Tensor input = split == TpSplit::kColumn ? gather_rows(shard, x) : x;
  const int64_t n = input.numel() / in;
  // Column: every row of this part's columns; row: this part's share of every row, summed
  // over the parts and scattered by rows, then the replicated bias.
  Tensor y = split == TpSplit::kColumn ? arena.alloc({n, out}, x.dtype()) : shard.seam->staging().alloc({n, out}, x.dtype());
  LOOM_DISPATCH_FLOAT(x.dtype(), T,
                      k::matmul_forward(y.data<T>(), input.data<T>(), weight.value().data<T>(),
                                        bias.defined() && split == TpSplit::kColumn ? bias.value().data<T>() : nullptr, n,
                                        in, out, k::WeightLayout::kKM, static_cast<T*>(nullptr), precision));
  if (split == TpSplit::kColumn) {
    round_values(y, precision);
    return y;
  }
  Tensor mine = scatter_rows(shard, y, arena);
  if (bias.defined()) add_bias(mine, bias.value());
  round_values(mine, precision);
  return mine;
}

Tensor Linear::backward_sequence(const Tensor& dy, LinearCtx& ctx, Arena& arena) const {
  const StepPartScope part(StepPart::kLinearDataGrad);
  shard.seam->staging().reset();
  // Column: this part's columns of dy for every row; the input gathered again, dx summed
  // over the parts and scattered by rows. Row: dy's rows gathered from every part, so the
  // replicated bias's gradient is whole on every part.
  const bool column = split == TpSplit::kColumn;
  const Tensor x = column ? gather_rows(shard, ctx.x) : ctx.x;
  const Tensor dout = column ? dy : gather_rows(shard, dy);
  const int64_t n = dout.numel() / out;
  Tensor dx = column ? shard.seam->staging().alloc({n, in}, dy.dtype()) : arena.alloc(ctx.x.shape(), dy.dtype());
  LOOM_DISPATCH_FLOAT(dy.dtype(), T,
                      k::matmul_backward(dx.data<T>(), weight.grad().data<T>(),
                                         bias.defined() ? bias.grad().data<T>() : nullptr, dout.data<T>(), x.data<T>(),
                                         weight.value().data<T>(), n, in, out, k::WeightLayout::kKM, precision));
  if (column) dx = scatter_rows(shard, dx, arena);
  round_values(dx, precision);
  return dx;
}

Tensor Linear::forward(const Tensor& x, LinearCtx& ctx, Arena& arena, const Tensor& residual) const {
  const StepPartScope part(StepPart::kLinearForward);
  LOOM_CHECK_EQ(x.dim(-1), in);
  // The residual added where the product's epilogue could not: after the output is final.
  const auto plus_residual = [&](const Tensor& y) {
    if (residual.defined()) add_into(y, residual, precision);
    return y;
  };
  if (split != TpSplit::kNone && shard.sequence_split()) return plus_residual(forward_sequence(x, ctx, arena));
  ctx.x = x;
  const int64_t n = x.numel() / in;
  const DType y_dtype = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  LOOM_CHECK(!residual.defined() || (residual.shape() == with_last(x, out) && residual.dtype() == y_dtype));
  if (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) {  // mixed precision's GELU output, in 16 bits
    LOOM_CHECK(x.dtype() == precision && split == TpSplit::kNone && int8 == nullptr && panels == nullptr);
    Tensor y = arena.alloc(with_last(x, out), DType::kF32);
    k::matmul_forward_half(y.data<float>(), nullptr, nullptr, nullptr, x.data<uint16_t>(),
                           weight.value().data<float>(), bias.defined() ? bias.value().data<float>() : nullptr, n, in,
                           out, precision, false, residual.defined() ? residual.data<float>() : nullptr);
    return y;
  }
  Tensor y = arena.alloc(with_last(x, out), x.dtype());
  if (int8 != nullptr) {
    LOOM_CHECK(!shard.split() && x.dtype() == DType::kF32 && precision == DType::kF32);
    k::int8_matmul_forward(y.data<float>(), x.data<float>(), *int8, bias.defined() ? bias.value().data<float>() : nullptr, n);
    return plus_residual(y);
  }
  if (panels != nullptr) {
    LOOM_CHECK(!shard.split() && x.dtype() == DType::kF32 && precision == DType::kF32);
    k::matmul_forward_panels(y.data<float>(), x.data<float>(), *panels, bias.defined() ? bias.value().data<float>() : nullptr, n);
    return plus_residual(y);
  }
  // The bias, the rounding of mixed precision and the residual wait for a row split's sum;
  // otherwise the product's epilogue rounds each tile (and adds the residual) while it is in cache.
  const bool row = split == TpSplit::kRow;
  LOOM_DISPATCH_FLOAT(x.dtype(), T, {
    k::matmul_forward(y.data<T>(), x.data<T>(), weight.value().data<T>(),
                      bias.defined() && !row ? bias.value().data<T>() : nullptr, n, in, out, k::WeightLayout::kKM,
                      static_cast<T*>(nullptr), precision, row ? DType::kF32 : precision,
                      residual.defined() && !row ? residual.data<T>() : nullptr);
  });
  if (row) {
    shard.seam->sum(y);
    if (bias.defined()) add_bias(y, bias.value());
    round_values(y, precision);
    return plus_residual(y);
  }
  return y;
}

Tensor Linear::forward_kept(const Tensor& x, LinearCtx& ctx, Arena& arena, Arena& kept) const {
  const StepPartScope part(StepPart::kLinearForward);
  LOOM_CHECK_EQ(x.dim(-1), in);
  const bool x_bits = x.dtype() != DType::kF32;
  LOOM_CHECK(precision != DType::kF32 && (!x_bits || x.dtype() == precision) && split == TpSplit::kNone &&
             int8 == nullptr && panels == nullptr);
  ctx.x = x;
  Tensor y = arena.alloc(with_last(x, out), DType::kF32);
  Tensor bits = kept.alloc(y.shape(), precision);
  k::matmul_forward_half(y.data<float>(), bits.data<uint16_t>(), nullptr, x_bits ? nullptr : x.data<float>(),
                         x_bits ? x.data<uint16_t>() : nullptr, weight.value().data<float>(),
                         bias.defined() ? bias.value().data<float>() : nullptr, x.numel() / in, in, out, precision,
                         /*out_scratch=*/true);
  return bits;
}

std::pair<Tensor, Tensor> Linear::forward_gelu(const Tensor& x, LinearCtx& ctx, Arena& arena, Arena* kept) const {
  const StepPartScope part(StepPart::kLinearForward);
  // Mixed precision: the epilogue rounds the output, takes the GELU of the rounded values and
  // rounds that too.
  if (split == TpSplit::kRow || (split != TpSplit::kNone && shard.sequence_split())) {
    Tensor y = forward(x, ctx, arena);
    Tensor g = arena.alloc(y.shape(), y.dtype());
    LOOM_DISPATCH_FLOAT(y.dtype(), T, k::gelu_forward(g.data<T>(), y.data<T>(), y.numel()));
    round_values(g, precision);
    return {y, g};
  }
  LOOM_CHECK_EQ(x.dim(-1), in);
  ctx.x = x;
  if (precision != DType::kF32 && split == TpSplit::kNone && int8 == nullptr && panels == nullptr) {
    // Mixed precision: the GELU straight into 16 bits, which c_proj packs and the backward
    // keeps as they are (an f32 copy was written, read by c_proj, then converted). With
    // `kept`, both go there, y's in 16 bits too, as each tile is finished.
    const bool x_bits = x.dtype() != DType::kF32;  // a LayerNorm's output kept in 16 bits
    LOOM_CHECK(!x_bits || x.dtype() == precision);
    Tensor y = arena.alloc(with_last(x, out), DType::kF32);
    Tensor y_bits = kept != nullptr ? kept->alloc(y.shape(), precision) : Tensor();
    Tensor bits = (kept != nullptr ? *kept : arena).alloc(y.shape(), precision);
    k::matmul_forward_half(y.data<float>(), kept != nullptr ? y_bits.data<uint16_t>() : nullptr, bits.data<uint16_t>(),
                           x_bits ? nullptr : x.data<float>(), x_bits ? x.data<uint16_t>() : nullptr,
                           weight.value().data<float>(), bias.defined() ? bias.value().data<float>() : nullptr,
                           x.numel() / in, in, out, precision, /*out_scratch=*/kept != nullptr);
    return {kept != nullptr ? y_bits : y, bits};
  }
  Tensor y = arena.alloc(with_last(x, out), x.dtype());
  Tensor g = arena.alloc(y.shape(), x.dtype());
  if (int8 != nullptr) {
    LOOM_CHECK(!shard.split() && x.dtype() == DType::kF32 && precision == DType::kF32);
    k::int8_matmul_forward(y.data<float>(), x.data<float>(), *int8, bias.defined() ? bias.value().data<float>() : nullptr,
                           x.numel() / in, g.data<float>());
    return {y, g};
  }
  if (panels != nullptr) {
    LOOM_CHECK(!shard.split() && x.dtype() == DType::kF32 && precision == DType::kF32);
    k::matmul_forward_panels(y.data<float>(), x.data<float>(), *panels, bias.defined() ? bias.value().data<float>() : nullptr,
                             x.numel() / in, g.data<float>());
    return {y, g};
  }
  LOOM_DISPATCH_FLOAT(x.dtype(), T, {
    k::matmul_forward(y.data<T>(), x.data<T>(), weight.value().data<T>(), bias.defined() ? bias.value().data<T>() : nullptr,
                      x.numel() / in, in, out, k::WeightLayout::kKM, g.data<T>(), precision, precision);
  });
  return {y, g};
}

Tensor Linear::backward(const Tensor& dy, LinearCtx& ctx, Arena& arena, bool need_dx, bool defer_weights) const {
  const StepPartScope part(StepPart::kLinearDataGrad);
  LOOM_CHECK(int8 == nullptr && panels == nullptr);  // int8 weights and panels are for inference
  // Mixed precision's MLP hands c_fc its gradient in 16 bits (Linear::backward_gelu).
  const bool dy_bits = dy.dtype() == DType::kBF16 || dy.dtype() == DType::kF16;
  LOOM_CHECK(!dy_bits || (dy.dtype() == precision && ctx.x.dtype() == precision));
  if (split != TpSplit::kNone && shard.sequence_split()) {
    LOOM_CHECK(need_dx && !defer_weights && !dy_bits);  // sequence parallelism runs without pipeline stages
    return backward_sequence(dy, ctx, arena);
  }
  const DType grad = dy_bits ? DType::kF32 : dy.dtype();
  Tensor dx = need_dx ? arena.alloc(ctx.x.shape(), grad) : Tensor();
  const int64_t n = dy.numel() / out;
  const Tensor& w = weight.value();
  ctx.dy = dy;
  // (Mixed precision keeps some inputs x in 16 bits, nn/mixed.h; only backward_weight reads x.)
  // Mixed precision rounds dx in the product's epilogue, tile by tile; a column split's dx
  // once the parts' shares are summed.
  const bool summed = split == TpSplit::kColumn;
  const DType round_dx = summed ? DType::kF32 : precision;
  // dx alone, then the weight gradients (backward_weight; the same bits as one call: each
  // output of the products is computed alone). Column: every part's share of dx summed, the
  // sum travelling while this part computes its weight gradients.
  if (need_dx && dy_bits) {
    k::matmul_dinp_bits(dx.data<float>(), dy.data<uint16_t>(), w.data<float>(), n, in, out, precision, round_dx);
  } else if (need_dx) {
    LOOM_DISPATCH_FLOAT(dy.dtype(), T,
                        k::matmul_backward(dx.data<T>(), static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                                           dy.data<T>(), static_cast<const T*>(nullptr), w.data<T>(), n, in, out,
                                           k::WeightLayout::kKM, precision, round_dx));
  }
  std::unique_ptr<Seam::Pending> sum = need_dx && summed ? shard.seam->start_sum(dx) : nullptr;
  if (!defer_weights) backward_weight(ctx);
  if (sum) sum->wait();
  if (!defer_weights) ctx.dy = Tensor();
  if (need_dx && summed) round_values(dx, precision);
  return dx;
}

Tensor Linear::backward_gelu(const Tensor& dy, LinearCtx& ctx, const Tensor& h, Arena& arena,
                             bool defer_weights) const {
  const StepPartScope part(StepPart::kLinearDataGrad);
  LOOM_CHECK(int8 == nullptr && panels == nullptr && split != TpSplit::kColumn && !shard.sequence_split());
  LOOM_CHECK((precision == DType::kBF16 || precision == DType::kF16) && dy.dtype() == DType::kF32);
  LOOM_CHECK(h.dtype() == precision && h.numel() == ctx.x.numel());
  Tensor dx = arena.alloc(ctx.x.shape(), DType::kF32);  // the product's output, rounded, then scratch
  Tensor dh = arena.alloc(ctx.x.shape(), precision);
  ctx.dy = dy;
  k::matmul_backward_gelu_bits(dh.data<uint16_t>(), dx.data<float>(), dy.data<float>(), weight.value().data<float>(),
                               h.data<uint16_t>(), dy.numel() / out, in, out, precision);
  if (!defer_weights) {
    backward_weight(ctx);
    ctx.dy = Tensor();
  }
  return dh;
}

void Linear::backward_weight(const LinearCtx& ctx) const {
  const StepPartScope part(StepPart::kLinearWeightGrad);
  LOOM_CHECK(ctx.dy.defined());
  LOOM_CHECK(split == TpSplit::kNone || !shard.sequence_split());  // its input is not kept gathered
  const int64_t n = ctx.dy.numel() / out;
  if (ctx.x.dtype() == DType::kBF16 || ctx.x.dtype() == DType::kF16) {
    // x kept in 16 bits, dy f32 or (from backward_gelu) 16-bit too: the products pack the bits
    LOOM_CHECK(ctx.x.dtype() == precision && (ctx.dy.dtype() == DType::kF32 || ctx.dy.dtype() == precision));
    float* db = bias.defined() ? bias.grad().data<float>() : nullptr;
    if (ctx.dy.dtype() == DType::kF32)
      k::matmul_weight_grad_bits(weight.grad().data<float>(), db, ctx.dy.data<float>(), ctx.x.data<uint16_t>(),
                                 precision, n, in, out);
    else
      k::matmul_weight_grad_bits(weight.grad().data<float>(), db, ctx.dy.data<uint16_t>(), ctx.x.data<uint16_t>(),
                                 precision, n, in, out);
    return;
  }
  LOOM_DISPATCH_FLOAT(ctx.dy.dtype(), T,
                      k::matmul_backward(static_cast<T*>(nullptr), weight.grad().data<T>(),
                                         bias.defined() ? bias.grad().data<T>() : nullptr, ctx.dy.data<T>(),
                                         ctx.x.data<T>(), weight.value().data<T>(), n, in, out,
                                         k::WeightLayout::kKM, precision));
}

LayerNorm::LayerNorm(ParamSet& ps, const std::string& prefix, int64_t c_, Shard shard_) : c(c_), shard(shard_) {
  weight = ps.add(prefix + ".weight", {c}, ParamKind::kNorm);
  bias = ps.add(prefix + ".bias", {c}, ParamKind::kNorm);
}

Tensor LayerNorm::forward(const Tensor& x, LayerNormCtx& ctx, Arena& arena, Arena* kept) const {
  const StepPartScope part(StepPart::kNormForward);
  return forward_add(x, Tensor(), ctx, arena, kept);
}

Tensor LayerNorm::forward_add(const Tensor& x, const Tensor& residual, LayerNormCtx& ctx, Arena& arena,
                              Arena* kept) const {
  const StepPartScope part(StepPart::kNormForward);
  LOOM_CHECK_EQ(x.dim(-1), c);
  LOOM_CHECK(!residual.defined() || (x.shape() == residual.shape() && x.dtype() == residual.dtype()));
  const int64_t n = x.numel() / c;
  ctx.x = x;
  ctx.mean = arena.alloc({n}, x.dtype());
  ctx.rstd = arena.alloc({n}, x.dtype());
  if (kept != nullptr) {  // mixed precision: the output, and the sum, in 16 bits where the block keeps them
    LOOM_CHECK(precision != DType::kF32 && x.dtype() == DType::kF32);
    Tensor y = kept->alloc(x.shape(), precision);
    if (residual.defined()) {
      ctx.x = kept->alloc(x.shape(), precision);
      k::add_layernorm_forward(x.data<float>(), residual.data<float>(), static_cast<float*>(nullptr),
                               ctx.mean.data<float>(), ctx.rstd.data<float>(), weight.value().data<float>(),
                               bias.value().data<float>(), n, c, precision, y.data<uint16_t>(),
                               ctx.x.data<uint16_t>());
    } else {
      k::layernorm_forward(static_cast<float*>(nullptr), ctx.mean.data<float>(), ctx.rstd.data<float>(),
                           x.data<float>(), weight.value().data<float>(), bias.value().data<float>(), n, c, precision,
                           y.data<uint16_t>());
    }
    return y;
  }
  Tensor y = arena.alloc(x.shape(), x.dtype());
  // One pass over the rows: the residual add (mixed precision rounds the sum before it is
  // normalized), the LayerNorm, and its output's rounding.
  LOOM_DISPATCH_FLOAT(x.dtype(), T, {
    if (residual.defined())
      k::add_layernorm_forward(x.data<T>(), residual.data<T>(), y.data<T>(), ctx.mean.data<T>(), ctx.rstd.data<T>(),
                               weight.value().data<T>(), bias.value().data<T>(), n, c, precision);
    else
      k::layernorm_forward(y.data<T>(), ctx.mean.data<T>(), ctx.rstd.data<T>(), x.data<T>(), weight.value().data<T>(),
                           bias.value().data<T>(), n, c, precision);
  });
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, const LayerNormCtx& ctx, Arena& arena, const Tensor& residual) const {
  const StepPartScope part(StepPart::kNormBackward);
  LOOM_CHECK(!residual.defined() || (residual.shape() == dy.shape() && residual.dtype() == dy.dtype()));
  Tensor dx = arena.alloc(dy.shape(), dy.dtype());
  // Sequence-parallel: this part's rows' share of the parameter gradients, summed over the
  // parts, then added in.
  Tensor share;
  if (shard.sequence_split()) {
    shard.seam->staging().reset();
    share = shard.seam->staging().zeros({2, c}, dy.dtype());
  }
  LOOM_DISPATCH_FLOAT(dy.dtype(), T, {
    T* dw = share.defined() ? share.data<T>() : weight.grad().data<T>();
    T* db = share.defined() ? share.data<T>() + c : bias.grad().data<T>();
    if (ctx.x.dtype() != dy.dtype()) {  // x kept in 16 bits (nn/mixed.h): read as it is
      LOOM_CHECK(dy.dtype() == DType::kF32);
      k::layernorm_backward_bits(dx.data<float>(), share.defined() ? share.data<float>() : weight.grad().data<float>(),
                                 share.defined() ? share.data<float>() + c : bias.grad().data<float>(),
                                 dy.data<float>(), ctx.x.data<uint16_t>(), ctx.x.dtype(), weight.value().data<float>(),
                                 ctx.mean.data<float>(), ctx.rstd.data<float>(), dy.numel() / c, c, precision,
                                 residual.defined() ? residual.data<float>() : nullptr);
    } else {
      k::layernorm_backward(dx.data<T>(), dw, db, dy.data<T>(), ctx.x.data<T>(), weight.value().data<T>(),
                            ctx.mean.data<T>(), ctx.rstd.data<T>(), dy.numel() / c, c, precision,
                            residual.defined() ? residual.data<T>() : nullptr);
    }
    if (share.defined()) {
      shard.seam->sum(share);
      T* gw = weight.grad().data<T>();
      T* gb = bias.grad().data<T>();
      for (int64_t j = 0; j < c; ++j) gw[j] += dw[j], gb[j] += db[j];
    }
  });
  return dx;
}

Tensor Gelu::forward(const Tensor& x, GeluCtx& ctx, Arena& arena) const {
  const StepPartScope part(StepPart::kGeluForward);
  ctx.x = x;
  Tensor y = arena.alloc(x.shape(), x.dtype());
  LOOM_DISPATCH_FLOAT(x.dtype(), T, k::gelu_forward(y.data<T>(), x.data<T>(), x.numel()));
  return y;
}

Tensor Gelu::backward(const Tensor& dy, const GeluCtx& ctx, Arena& arena, DType round_out) const {
  const StepPartScope part(StepPart::kGeluBackward);
  Tensor dx = arena.alloc(dy.shape(), dy.dtype());
  if (ctx.x.dtype() != dy.dtype()) {  // x kept in 16 bits (nn/mixed.h): read as it is, in one pass
    LOOM_CHECK(dy.dtype() == DType::kF32);
    k::gelu_backward_bits(dx.data<float>(), ctx.x.data<uint16_t>(), ctx.x.dtype(), dy.data<float>(), dy.numel(),
                          round_out);
    return dx;
  }
  LOOM_DISPATCH_FLOAT(dy.dtype(), T,
                      k::gelu_backward(dx.data<T>(), ctx.x.data<T>(), dy.data<T>(), dy.numel()));
  round_values(dx, round_out);
  return dx;
}

Embedding::Embedding(ParamSet& ps, const std::string& name, int64_t rows_, int64_t c_, Shard shard_)
    : rows(rows_), c(c_), shard(shard_) {
  ParamSplit split;
  if (shard.split()) {
    LOOM_CHECK(rows % shard.parts == 0 && shard.seam != nullptr);
    rows /= shard.parts;
    split = {.dim = 0, .index = shard.index, .parts = shard.parts};
  }
  table = ps.add(name, {rows, c}, ParamKind::kEmbedding, split);
}

Tensor Embedding::forward(const Tensor& ids, EmbeddingCtx& ctx, Arena& arena) const {
  const StepPartScope part(StepPart::kEdgesForward);
  ctx.ids = ids;
  if (shard.split()) {  // this part's rows by their place in its piece; -1 for the others'
    ctx.ids = arena.alloc(ids.shape(), DType::kI32);
    const int32_t* from = ids.data<int32_t>();
    int32_t* to = ctx.ids.data<int32_t>();
    const int64_t begin = shard.index * rows;
    for (int64_t i = 0; i < ids.numel(); ++i)
      to[i] = from[i] >= begin && from[i] < begin + rows ? static_cast<int32_t>(from[i] - begin) : -1;
  }
  Shape s = ids.shape();
  s.push_back(c);
  if (shard.sequence_split()) {
    shard.seam->staging().reset();
    s = {ids.numel(), c};
  }
  Tensor y = shard.sequence_split() ? shard.seam->staging().alloc(s, table.value().dtype()) : arena.alloc(s, table.value().dtype());
  if (int8 != nullptr) {
    LOOM_CHECK(!shard.split() && y.dtype() == DType::kF32);
    for (int64_t i = 0; i < ids.numel(); ++i) k::dequantize_channel(*int8, ids.data<int32_t>()[i], y.data<float>() + i * c);
    return y;
  }
  if (panels != nullptr) {
    LOOM_CHECK(!shard.split() && y.dtype() == DType::kF32);
    for (int64_t i = 0; i < ids.numel(); ++i) k::panel_column(*panels, ids.data<int32_t>()[i], y.data<float>() + i * c);
    return y;
  }
  LOOM_DISPATCH_FLOAT(y.dtype(), T,
                      k::embedding_forward(y.data<T>(), ctx.ids.data<int32_t>(),
                                           table.value().data<T>(), ids.numel(), c));
  if (shard.sequence_split()) return scatter_rows(shard, y, arena);
  if (shard.split()) shard.seam->sum(y);
  return y;
}

void Embedding::backward(const Tensor& dy, const EmbeddingCtx& ctx) const {
  const StepPartScope part(StepPart::kEdgesBackward);
  LOOM_CHECK(int8 == nullptr && panels == nullptr);  // int8 weights and panels are for inference
  LOOM_DISPATCH_FLOAT(dy.dtype(), T,
                      k::embedding_backward(table.grad().data<T>(), ctx.ids.data<int32_t>(),
                                            dy.data<T>(), ctx.ids.numel(), c));
}

double CrossEntropy::forward(const Tensor& logits, const Tensor& targets, CrossEntropyCtx& ctx,
                             Arena& arena) const {
  const StepPartScope part(StepPart::kEdgesForward);
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  LOOM_CHECK_EQ(targets.numel(), n);
  ctx.logits = logits;
  ctx.targets = targets;
  Tensor losses = arena.alloc({n}, logits.dtype());
  const DistillTargets& kd = ctx.distill;
  if (kd.soft.defined()) LOOM_CHECK(kd.soft.numel() == logits.numel() && kd.soft.dtype() == logits.dtype());
  if (vocab.split() || kd.soft.defined()) ctx.stats = arena.alloc({kd.soft.defined() ? 6 : 3, n}, logits.dtype());
  double sum = 0;
  LOOM_DISPATCH_FLOAT(logits.dtype(), T, {
    T* l = losses.data<T>();
    const int32_t* tg = targets.data<int32_t>();
    if (kd.soft.defined()) {  // the vocab-parallel arithmetic, whole rows being one part
      T* st = ctx.stats.data<T>();
      const auto temp = static_cast<T>(kd.temperature), alpha = static_cast<T>(kd.alpha);
      k::cross_entropy_slice_max(st, logits.data<T>(), n, v);
      if (vocab.split()) vocab.seam->max(ctx.stats.slice_rows(0, 1));
      k::cross_entropy_slice_sums(st + n, logits.data<T>(), tg, st, n, v, vocab.index * v);
      k::distill_slice_sums(st + 3 * n, logits.data<T>(), kd.soft.data<T>(), st, n, v, temp);
      if (vocab.split()) vocab.seam->sum(ctx.stats.slice_rows(1, 6));
      for (int64_t i = 0; i < n; ++i) {
        const T hard = std::log(st[n + i]) + st[i] - st[2 * n + i];
        const T kl = st[5 * n + i] - st[4 * n + i] / temp + st[i] / temp + std::log(st[3 * n + i]);
        l[i] = (T(1) - alpha) * hard + alpha * temp * temp * kl;
      }
    } else if (vocab.split()) {
      T* mx = ctx.stats.data<T>();
      k::cross_entropy_slice_max(mx, logits.data<T>(), n, v);
      vocab.seam->max(ctx.stats.slice_rows(0, 1));
      k::cross_entropy_slice_sums(mx + n, logits.data<T>(), tg, mx, n, v, vocab.index * v);
      vocab.seam->sum(ctx.stats.slice_rows(1, 3));
      for (int64_t i = 0; i < n; ++i) l[i] = std::log(mx[n + i]) + mx[i] - mx[2 * n + i];
    } else {
      k::cross_entropy_forward(l, logits.data<T>(), tg, n, v);
    }
    for (int64_t i = 0; i < n; ++i) sum += l[i];  // in order, in double: deterministic
  });
  return n == 0 ? 0.0 : sum / static_cast<double>(n);
}

Tensor CrossEntropy::backward(const CrossEntropyCtx& ctx, double scale) const {
  const StepPartScope part(StepPart::kEdgesBackward);
  const Tensor& logits = ctx.logits;
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  LOOM_DISPATCH_FLOAT(logits.dtype(), T, {
    const auto dloss = static_cast<T>(scale / static_cast<double>(n));
    const int32_t* tg = ctx.targets.data<int32_t>();
    const DistillTargets& kd = ctx.distill;
    if (kd.soft.defined()) {
      const T* st = ctx.stats.data<T>();
      k::distill_slice_backward(logits.data<T>(), logits.data<T>(), tg, kd.soft.data<T>(), st, st + n, st + 3 * n, dloss,
                                static_cast<T>(kd.alpha), static_cast<T>(kd.temperature), n, v, vocab.index * v);
    } else if (vocab.split()) {
      const T* stats = ctx.stats.data<T>();
      k::cross_entropy_slice_backward(logits.data<T>(), logits.data<T>(), tg, stats, stats + n, dloss, n, v,
                                      vocab.index * v);
    } else {
      k::cross_entropy_backward(logits.data<T>(), logits.data<T>(), tg, dloss, n, v);
    }
  });
  return logits;
}

}  // namespace loom::nn
