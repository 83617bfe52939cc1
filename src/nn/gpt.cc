#include "loom/nn/gpt.h"

#include <cmath>

#include "kernels/matmul.h"
#include "loom/rng.h"
#include "nn/dispatch.h"

namespace loom::nn {
namespace k = loom::kernels;

Gpt::Gpt(const GptConfig& config, DType dtype) : config_(config), params_(dtype) {
  const int64_t c = config.d_model;
  wte_ = Embedding(params_, "transformer.wte.weight", config.vocab_size, c);
  wpe_ = Embedding(params_, "transformer.wpe.weight", config.seq_len, c);
  for (int64_t l = 0; l < config.n_layer; ++l)
    blocks_.emplace_back(params_, "transformer.h." + std::to_string(l), c, config.n_head);
  ln_f_ = LayerNorm(params_, "transformer.ln_f", c);
  params_.allocate();
}

void Gpt::init(uint64_t seed) {
  Rng rng(seed, /*stream=*/1);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (size_t i = 0; i < params_.infos().size(); ++i) {
    const ParamInfo& p = params_.infos()[i];
    Tensor v = params_.value(static_cast<int>(i));
    bool residual = p.name.ends_with("attn.c_proj.weight") || p.name.ends_with("mlp.c_proj.weight");
    double std = residual ? residual_std : 0.02;
    LOOM_DISPATCH_FLOAT(v.dtype(), T, {
      T* d = v.data<T>();
      for (int64_t j = 0; j < p.numel; ++j) {
        if (p.kind == ParamKind::kBias || (p.kind == ParamKind::kNorm && p.name.ends_with(".bias")))
          d[j] = 0;
        else if (p.kind == ParamKind::kNorm)
          d[j] = 1;
        else
          d[j] = static_cast<T>(rng.normal() * std);
      }
    });
  }
}

Tensor Gpt::trunk(const Tensor& tokens, GptCtx& ctx) const {
  LOOM_CHECK_EQ(tokens.ndim(), 2);
  ctx.b = tokens.dim(0);
  ctx.t = tokens.dim(1);
  LOOM_CHECK_LE(ctx.t, config_.seq_len);
  ctx.arena.reset();
  if (on_block) on_block(-1, BlockPhase::kForward);
  ctx.positions = ctx.arena.alloc({ctx.b, ctx.t}, DType::kI32);
  int32_t* pos = ctx.positions.data<int32_t>();
  for (int64_t i = 0; i < ctx.b * ctx.t; ++i) pos[i] = static_cast<int32_t>(i % ctx.t);

  Tensor x = wte_.forward(tokens, ctx.wte, ctx.arena);
  Tensor p = wpe_.forward(ctx.positions, ctx.wpe, ctx.arena);
  LOOM_DISPATCH_FLOAT(x.dtype(), T, {
    T* xd = x.data<T>();
    const T* pd = p.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) xd[i] += pd[i];
  });
  ctx.blocks.resize(blocks_.size());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (on_block) on_block(static_cast<int>(l), BlockPhase::kForward);
    x = blocks_[l].forward(x, ctx.blocks[l], ctx.arena);
    if (on_block) on_block(static_cast<int>(l), BlockPhase::kForwardDone);
  }
  return ln_f_.forward(x, ctx.ln_f, ctx.arena);
}

Tensor Gpt::forward_logits(const Tensor& tokens, GptCtx& ctx, bool last_only) const {
  Tensor h = trunk(tokens, ctx);  // (B, T, C)
  const int64_t c = config_.d_model, v = config_.vocab_size;
  if (last_only) {
    Tensor rows = h.view({ctx.b * ctx.t, c});
    Tensor last = ctx.arena.alloc({ctx.b, 1, c}, h.dtype());
    Tensor last_rows = last.view({ctx.b, c});
    for (int64_t bi = 0; bi < ctx.b; ++bi)
      last_rows.slice_rows(bi, bi + 1).copy_from(rows.slice_rows((bi + 1) * ctx.t - 1, (bi + 1) * ctx.t));
    h = last;
  }
  ctx.head.x = h;
  Tensor logits = ctx.arena.alloc({h.dim(0), h.dim(1), v}, h.dtype());
  LOOM_DISPATCH_FLOAT(h.dtype(), T,
                      k::matmul_forward(logits.data<T>(), h.data<T>(), wte_.table.value().data<T>(),
                                        static_cast<const T*>(nullptr), h.numel() / c, c, v,
                                        k::WeightLayout::kMK));
  ctx.logits = logits;
  if (on_block) on_block(-1, BlockPhase::kForwardDone);
  return logits;
}

double Gpt::forward(const Tensor& tokens, const Tensor& targets, GptCtx& ctx) const {
  Tensor logits = forward_logits(tokens, ctx, /*last_only=*/false);
  return CrossEntropy().forward(logits, targets, ctx.loss, ctx.arena);
}

void Gpt::backward(GptCtx& ctx, double scale) const {
  const int64_t c = config_.d_model, v = config_.vocab_size;
  if (on_block) on_block(-1, BlockPhase::kBackward);
  Tensor dlogits = CrossEntropy().backward(ctx.loss, scale);
  Tensor dh = ctx.arena.alloc(ctx.head.x.shape(), dlogits.dtype());
  LOOM_DISPATCH_FLOAT(dh.dtype(), T,
                      k::matmul_backward(dh.data<T>(), wte_.table.grad().data<T>(),
                                         static_cast<T*>(nullptr), dlogits.data<T>(),
                                         ctx.head.x.data<T>(), wte_.table.value().data<T>(),
                                         dh.numel() / c, c, v, k::WeightLayout::kMK));
  Tensor dx = ln_f_.backward(dh, ctx.ln_f, ctx.arena);
  for (size_t l = blocks_.size(); l-- > 0;) {
    if (on_block) on_block(static_cast<int>(l), BlockPhase::kBackward);
    dx = blocks_[l].backward(dx, ctx.blocks[l], ctx.arena);
    if (on_block) on_block(static_cast<int>(l), BlockPhase::kBackwardDone);
  }
  wte_.backward(dx, ctx.wte);
  wpe_.backward(dx, ctx.wpe);
  if (on_block) on_block(-1, BlockPhase::kBackwardDone);
}

std::vector<int64_t> Gpt::block_offsets() const {
  // Blocks are registered after wte and wpe and before ln_f, each as one contiguous run.
  std::vector<int64_t> offsets;
  for (int64_t l = 0; l <= config_.n_layer; ++l) {
    const std::string prefix = l < config_.n_layer ? "transformer.h." + std::to_string(l) + "." : "transformer.ln_f.";
    for (const ParamInfo& p : params_.infos())
      if (p.name.starts_with(prefix)) {
        offsets.push_back(p.offset);
        break;
      }
  }
  LOOM_CHECK_EQ(static_cast<int64_t>(offsets.size()), config_.n_layer + 1);
  return offsets;
}

double Gpt::forward_flops_per_token(int64_t t) const {
  double matmul_params = 0;
  for (const ParamInfo& p : params_.infos())
    if (p.kind == ParamKind::kWeight) matmul_params += static_cast<double>(p.numel);
  matmul_params += static_cast<double>(config_.vocab_size * config_.d_model);  // tied head
  return 2 * matmul_params + 4.0 * config_.n_layer * config_.d_model * t;
}

}  // namespace loom::nn
