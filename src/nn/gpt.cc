#include "loom/nn/gpt.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/int8_matmul.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "kernels/precision.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/nn/step_breakdown.h"
#include "loom/core/dtype_dispatch.h"
#include "nn/mixed.h"
#include "nn/residual.h"

namespace loom::nn {
namespace k = loom::kernels;

namespace {
GptCtx& as_gpt(ModelCtx& ctx) {
  auto* g = dynamic_cast<GptCtx*>(&ctx);
  LOOM_CHECK(g != nullptr);  // a context another kind of model made
  return *g;
}
const GptCtx& as_gpt(const ModelCtx& ctx) {
  const auto* g = dynamic_cast<const GptCtx*>(&ctx);
  LOOM_CHECK(g != nullptr);
  return *g;
}
}  // namespace

ModelShape Gpt::shape() const {
  return {.kind = "gpt",
          .fields = {{"n_layer", config_.n_layer}, {"n_head", config_.n_head}, {"d_model", config_.d_model},
                     {"seq_len", config_.seq_len}, {"vocab_size", config_.vocab_size}}};
}

double Gpt::forward_flops_per_example() const {
  return forward_flops_per_token(config_.seq_len) * static_cast<double>(config_.seq_len);
}

std::unique_ptr<ModelCtx> Gpt::make_ctx() const { return std::make_unique<GptCtx>(); }

CrossEntropyCtx& Gpt::loss_ctx(ModelCtx& ctx) const { return as_gpt(ctx).loss; }

Gpt::Gpt(const GptConfig& config, DType dtype, GptPart part, Shard tp)
    : config_(config), part_(std::move(part)), tp_(tp), params_(dtype), loss_(tp) {
  LOOM_CHECK_EQ(gpt_config_problem(config), "");
  const int64_t c = config.d_model;
  if (part_.all_blocks) {
    part_.blocks.clear();
    for (int64_t l = 0; l < config.n_layer; ++l) part_.blocks.push_back(l);
  }
  LOOM_CHECK(std::is_sorted(part_.blocks.begin(), part_.blocks.end()));
  // Hugging Face order: wte, wpe, the blocks, ln_f (the head's weight is wte).
  if (part_.embeddings || part_.head) wte_ = Embedding(params_, "transformer.wte.weight", config.vocab_size, c, tp);
  if (part_.embeddings) wpe_ = Embedding(params_, "transformer.wpe.weight", config.seq_len, c);
  blocks_.resize(static_cast<size_t>(config.n_layer));
  for (int64_t l : part_.blocks) {
    LOOM_CHECK(l >= 0 && l < config.n_layer);
    blocks_[l] = Block(params_, "transformer.h." + std::to_string(l), c, config.n_head, tp);
  }
  if (part_.head) ln_f_ = LayerNorm(params_, "transformer.ln_f", c, tp);
  params_.allocate();
}

void Gpt::set_recompute(Recompute mode) {
  recompute_ = mode;
}

void Gpt::set_precision(DType format) {
  LOOM_CHECK(format == DType::kF32 || format == DType::kBF16 || format == DType::kF16);
  LOOM_CHECK(format == DType::kF32 || (params_.dtype() == DType::kF32 && !tp_.split() && int8_.empty()));
  precision_ = format;
  for (int64_t l : part_.blocks) blocks_[l].set_precision(format);
  ln_f_.precision = format;
}

bool Gpt::holds_block(int64_t block) const {
  return std::binary_search(part_.blocks.begin(), part_.blocks.end(), block);
}

void Gpt::init(uint64_t seed) {
  // One random stream over the whole model in registration order, whatever part this
  // process holds: parameters held elsewhere draw and discard their values, so every
  // pipeline stage starts from the weights one process would.
  ParamSet whole;  // the full layout, never allocated
  Embedding(whole, "transformer.wte.weight", config_.vocab_size, config_.d_model);
  Embedding(whole, "transformer.wpe.weight", config_.seq_len, config_.d_model);
  for (int64_t l = 0; l < config_.n_layer; ++l)
    Block(whole, "transformer.h." + std::to_string(l), config_.d_model, config_.n_head);
  LayerNorm(whole, "transformer.ln_f", config_.d_model);

  Rng rng(seed, /*stream=*/1);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (const ParamInfo& p : whole.infos()) {
    const int index = params_.find(p.name);
    const bool zero = p.kind == ParamKind::kBias || (p.kind == ParamKind::kNorm && p.name.ends_with(".bias"));
    const bool one = !zero && p.kind == ParamKind::kNorm;
    if (index < 0) {
      if (!zero && !one)
        for (int64_t j = 0; j < p.numel; ++j) rng.normal();
      continue;
    }
    Tensor v = params_.value(index);
    bool residual = p.name.ends_with("attn.c_proj.weight") || p.name.ends_with("mlp.c_proj.weight");
    double std = residual ? residual_std : 0.02;
    LOOM_DISPATCH_FLOAT(v.dtype(), T, {
      std::vector<T> whole_values(static_cast<size_t>(p.numel));  // the logical tensor; this part keeps its piece
      for (T& x : whole_values) x = zero ? T(0) : one ? T(1) : static_cast<T>(rng.normal() * std);
      take_piece(params_.infos()[index], whole_values.data(), v.data<T>());
    });
  }
}

void Gpt::begin(ModelCtx& model_ctx, int64_t b, int64_t t) const {
  GptCtx& ctx = as_gpt(model_ctx);
  LOOM_CHECK_LE(t, config_.seq_len);
  ctx.b = b;
  ctx.t = t;
  // The last micro-batch's tensors let go first, so the arena's reset can keep their pages
  // (Arena). The loss's distillation targets are the caller's, set for this micro-batch.
  ctx.positions = Tensor();
  ctx.wte = {};
  ctx.wpe = {};
  ctx.blocks.clear();
  ctx.ln_f = {};
  ctx.head = {};
  ctx.loss = {.distill = std::move(ctx.loss.distill)};
  ctx.logits = Tensor();
  ctx.dlogits = Tensor();
  ctx.arena.reset();
  ctx.blocks.resize(blocks_.size());
}

Tensor Gpt::embed(const Tensor& tokens, ModelCtx& model_ctx) const {
  const StepPartScope part(StepPart::kEdgesForward);
  GptCtx& ctx = as_gpt(model_ctx);
  LOOM_CHECK(part_.embeddings);
  LOOM_CHECK_EQ(tokens.ndim(), 2);
  LOOM_CHECK(tokens.dim(0) == ctx.b && tokens.dim(1) == ctx.t);
  ctx.positions = ctx.arena.alloc({ctx.b, ctx.t}, DType::kI32);
  int32_t* pos = ctx.positions.data<int32_t>();
  for (int64_t i = 0; i < ctx.b * ctx.t; ++i) pos[i] = static_cast<int32_t>(i % ctx.t);
  // Mixed precision: the sum goes to the workspace; forward_stage keeps its 16-bit copy.
  Arena& out = precision_ == DType::kF32 ? ctx.arena : scratch_;
  if (precision_ != DType::kF32) scratch_.reset();
  Tensor x = wte_.forward(tokens, ctx.wte, out);  // sequence-parallel: this piece's rows
  Tensor p = wpe_.forward(sequence_rows(ctx.positions.view({ctx.b * ctx.t})), ctx.wpe, out);
  ctx.wpe.ids = ctx.positions;  // backward_embed gathers every row
  // On the pool: a serial loop here (x.numel() recomputed each pass) was 0.8% of a 2-thread
  // bf16 gpt-mini step, the other thread waiting.
  LOOM_DISPATCH_FLOAT(x.dtype(), T, k::add_forward(x.data<T>(), x.data<T>(), p.data<T>(), x.numel()));
  return x;
}

Shape Gpt::activation_shape(int64_t b, int64_t t) const {
  if (tp_.sequence_split()) return {b * t / tp_.parts, config_.d_model};
  return {b, t, config_.d_model};
}

Tensor Gpt::sequence_rows(const Tensor& rows) const {
  if (!tp_.sequence_split()) return rows;
  const int64_t m = rows.dim(0) / tp_.parts;
  return rows.slice_rows(tp_.index * m, (tp_.index + 1) * m);
}

BlockCtx Gpt::block_ctx(const GptCtx& ctx) const {
  BlockCtx b;
  b.attn.b = ctx.b;  // sequence parallelism: the block sees only some rows
  b.attn.t = ctx.t;
  return b;
}

Tensor Gpt::forward_stage(int64_t lo, int64_t hi, const Tensor& x, ModelCtx& model_ctx) const {
  GptCtx& ctx = as_gpt(model_ctx);
  if (precision_ != DType::kF32) return forward_blocks_mixed(lo, hi, x, ctx);
  Tensor h = x;
  for (int64_t l = lo; l < hi; ++l) {
    LOOM_CHECK(holds_block(l));
    hooks_(static_cast<int>(l), BlockPhase::kForward);
    ctx.blocks[l] = block_ctx(ctx);
    if (recompute_ == Recompute::kFull) {  // keep the input; the rest lives in the workspace
      ctx.blocks[l].input = h;
      scratch_.reset();
      BlockCtx discard = block_ctx(ctx);
      Tensor y = blocks_[l].forward(h, discard, scratch_);
      h = ctx.arena.alloc(y.shape(), y.dtype());
      h.copy_from(y);
    } else {
      h = blocks_[l].forward(h, ctx.blocks[l], ctx.arena);
    }
    hooks_(static_cast<int>(l), BlockPhase::kForwardDone);
  }
  return h;
}

// Each block in the workspace on its f32 input, read from the 16-bit copy the arena keeps;
// its context and output then move to the arena in 16 bits (nn/mixed.h).
Tensor Gpt::forward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& x, GptCtx& ctx) const {
  Tensor h = mixed::to_half(x, precision_, ctx.arena);
  for (int64_t l = lo; l < hi; ++l) {
    LOOM_CHECK(holds_block(l));
    hooks_(static_cast<int>(l), BlockPhase::kForward);
    ctx.blocks[l] = block_ctx(ctx);
    scratch_.reset();
    const Tensor in = mixed::to_f32(h, scratch_);
    Tensor y;
    if (recompute_ == Recompute::kFull) {
      ctx.blocks[l].input = h;
      BlockCtx discard = block_ctx(ctx);
      y = blocks_[l].forward(in, discard, scratch_);
    } else {
      y = blocks_[l].forward(in, ctx.blocks[l], scratch_, &ctx.arena);
      mixed::keep_half(ctx.blocks[l], precision_, in, h, ctx.arena);
    }
    h = mixed::to_half(y, precision_, ctx.arena);
    hooks_(static_cast<int>(l), BlockPhase::kForwardDone);
  }
  return mixed::to_f32(h, ctx.arena);
}

Tensor Gpt::trunk(const Tensor& tokens, GptCtx& ctx) const {
  LOOM_CHECK_EQ(tokens.ndim(), 2);
  begin(ctx, tokens.dim(0), tokens.dim(1));
  hooks_(-1, BlockPhase::kForward);
  Tensor x = forward_stage(0, config_.n_layer, embed(tokens, ctx), ctx);
  return ln_f_.forward(x, ctx.ln_f, ctx.arena);
}

namespace {
// The last position of each sequence: (B, T, C) -> (B, 1, C).
Tensor last_positions(const Tensor& h, GptCtx& ctx, int64_t c) {
  Tensor rows = h.view({ctx.b * ctx.t, c});
  Tensor last = ctx.arena.alloc({ctx.b, 1, c}, h.dtype());
  Tensor last_rows = last.view({ctx.b, c});
  for (int64_t bi = 0; bi < ctx.b; ++bi)
    last_rows.slice_rows(bi, bi + 1).copy_from(rows.slice_rows((bi + 1) * ctx.t - 1, (bi + 1) * ctx.t));
  return last;
}
}  // namespace

Tensor Gpt::logits(const Tensor& h, GptCtx& ctx) const {
  const StepPartScope part(StepPart::kEdgesForward);
  const int64_t c = config_.d_model, v = wte_.rows;  // a vocab-parallel piece's columns
  ctx.head.x = h;
  if (tp_.sequence_split()) {  // every row of this piece's columns
    ctx.head.x = ctx.arena.alloc({h.numel() / c * tp_.parts, c}, h.dtype());
    tp_.seam->all_gather(h, ctx.head.x);
  }
  const Tensor& x = ctx.head.x;
  Tensor out = ctx.arena.alloc(x.ndim() == 3 ? Shape{x.dim(0), x.dim(1), v} : Shape{x.dim(0), v}, h.dtype());
  head_product(out, x);
  ctx.logits = out;
  return out;
}

void Gpt::head_product(const Tensor& out, const Tensor& x) const {
  const int64_t c = config_.d_model, v = wte_.rows, rows = x.numel() / c;
  if (wte_.int8 != nullptr) {
    k::int8_matmul_forward(out.data<float>(), x.data<float>(), *wte_.int8, nullptr, rows);
    return;
  }
  if (head_panels_ != nullptr) {
    k::matmul_forward_panels(out.data<float>(), x.data<float>(), *head_panels_, nullptr, rows);
    return;
  }
  // Mixed precision's logits rounded in the product's epilogue, block by block while they are
  // in cache (a pass of its own over gpt2-124m's 51 M logits a micro-batch of 1,024 tokens).
  LOOM_DISPATCH_FLOAT(x.dtype(), T,
                      k::matmul_forward(out.data<T>(), x.data<T>(), wte_.table.value().data<T>(),
                                        static_cast<const T*>(nullptr), rows, c, v, k::WeightLayout::kMK,
                                        static_cast<T*>(nullptr), precision_,
                                        std::is_same_v<T, float> ? precision_ : DType::kF32));
}

Tensor Gpt::forward_logits(const Tensor& tokens, GptCtx& ctx, bool last_only) const {
  LOOM_CHECK(!wte_.shard.split());
  Tensor h = trunk(tokens, ctx);  // (B, T, C)
  Tensor out = logits(last_only ? last_positions(h, ctx, config_.d_model) : h, ctx);
  hooks_(-1, BlockPhase::kForwardDone);
  return out;
}

Tensor Gpt::forward_hidden(const Tensor& tokens, GptCtx& ctx) const {
  LOOM_CHECK(!wte_.shard.split());
  Tensor h = trunk(tokens, ctx);
  hooks_(-1, BlockPhase::kForwardDone);
  return h;
}

void Gpt::head_logits(const Tensor& rows, const Tensor& out) const {
  LOOM_CHECK(!wte_.shard.split() && !tp_.sequence_split());
  LOOM_CHECK_EQ(out.numel(), rows.numel() / config_.d_model * wte_.rows);
  head_product(out, rows);
}

double Gpt::forward(const Tensor& tokens, const Tensor& targets, ModelCtx& model_ctx) const {
  GptCtx& ctx = as_gpt(model_ctx);
  Tensor out = logits(trunk(tokens, ctx), ctx);
  hooks_(-1, BlockPhase::kForwardDone);
  return loss_.forward(out, targets, ctx.loss, ctx.arena);
}

double Gpt::head(const Tensor& x, const Tensor& targets, ModelCtx& model_ctx) const {
  GptCtx& ctx = as_gpt(model_ctx);
  LOOM_CHECK(part_.head);
  Tensor out = logits(ln_f_.forward(x, ctx.ln_f, ctx.arena), ctx);
  return loss_.forward(out, targets, ctx.loss, ctx.arena);
}

Tensor Gpt::backward_head(ModelCtx& model_ctx, double scale, bool defer_weights) const {
  const StepPartScope part(StepPart::kEdgesBackward);
  GptCtx& ctx = as_gpt(model_ctx);
  const int64_t c = config_.d_model, v = wte_.rows;
  ctx.dlogits = loss_.backward(ctx.loss, scale);
  mixed::round_values(ctx.dlogits, precision_);
  // Sequence-parallel: every row's share of this piece's columns, summed over the pieces
  // and scattered by rows once the tied weight's gradient is computed.
  const bool sequence = tp_.sequence_split();
  if (sequence) tp_.seam->staging().reset();
  Tensor dh = (sequence ? tp_.seam->staging() : ctx.arena).alloc(ctx.head.x.shape(), ctx.dlogits.dtype());
  LOOM_DISPATCH_FLOAT(dh.dtype(), T,
                      k::matmul_backward(dh.data<T>(), static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                                         ctx.dlogits.data<T>(), ctx.head.x.data<T>(), wte_.table.value().data<T>(),
                                         dh.numel() / c, c, v, k::WeightLayout::kMK, precision_));
  mixed::round_values(dh, precision_);
  // Vocab-parallel: every piece's columns' share of dh summed, while this piece computes
  // its rows of the tied weight's gradient.
  std::unique_ptr<Seam::Pending> sum = wte_.shard.split() && !sequence ? wte_.shard.seam->start_sum(dh) : nullptr;
  if (!defer_weights) {
    backward_weights(0, 0, /*head=*/true, ctx);
    ctx.dlogits = Tensor();
  }
  if (sum) sum->wait();
  if (sequence) {
    Tensor mine = ctx.arena.alloc({dh.dim(0) / tp_.parts, c}, dh.dtype());
    tp_.seam->reduce_scatter(dh, mine);
    dh = mine;
  }
  return ln_f_.backward(dh, ctx.ln_f, ctx.arena);
}

Tensor Gpt::backward_stage(int64_t lo, int64_t hi, const Tensor& dy, ModelCtx& model_ctx, bool defer_weights) const {
  GptCtx& ctx = as_gpt(model_ctx);
  if (precision_ != DType::kF32) {
    LOOM_CHECK(!defer_weights);  // the weight passes would need the block's workspace later
    return backward_blocks_mixed(lo, hi, dy, ctx);
  }
  Tensor dx = dy;
  for (int64_t l = hi; l-- > lo;) {
    hooks_(static_cast<int>(l), BlockPhase::kBackward);
    if (recompute_ == Recompute::kFull) {  // the block's forward again, then its backward
      LOOM_CHECK(!defer_weights);
      scratch_.reset();
      BlockCtx again = block_ctx(ctx);
      blocks_[l].forward(ctx.blocks[l].input, again, scratch_);
      Tensor d = blocks_[l].backward(dx, again, scratch_);
      dx = ctx.arena.alloc(d.shape(), d.dtype());
      dx.copy_from(d);
    } else {
      dx = blocks_[l].backward(dx, ctx.blocks[l], ctx.arena, defer_weights);
    }
    hooks_(static_cast<int>(l), BlockPhase::kBackwardDone);
  }
  return dx;
}

// Each block's context back to f32 in the workspace (or, under full recompute, its forward
// again there), then its backward; d(input) goes on in one f32 buffer of the arena.
Tensor Gpt::backward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& dy, GptCtx& ctx) const {
  Tensor dx = ctx.arena.alloc(dy.shape(), DType::kF32);
  dx.copy_from(dy);
  mixed::round_values(dx, precision_);
  for (int64_t l = hi; l-- > lo;) {
    hooks_(static_cast<int>(l), BlockPhase::kBackward);
    scratch_.reset();
    Tensor d;
    if (recompute_ == Recompute::kFull) {
      BlockCtx again = block_ctx(ctx);
      blocks_[l].forward(mixed::to_f32(ctx.blocks[l].input, scratch_), again, scratch_);
      d = blocks_[l].backward(dx, again, scratch_);
    } else {
      mixed::load_f32(ctx.blocks[l], scratch_, !tp_.sequence_split());
      d = blocks_[l].backward(dx, ctx.blocks[l], scratch_);
    }
    dx.copy_from(d);
    ctx.blocks[l] = BlockCtx();  // its tensors were in the workspace
    hooks_(static_cast<int>(l), BlockPhase::kBackwardDone);
  }
  return dx;
}

void Gpt::backward_weights(int64_t lo, int64_t hi, bool head, const ModelCtx& model_ctx) const {
  const GptCtx& ctx = as_gpt(model_ctx);
  if (head) {
    const StepPartScope part(StepPart::kEdgesBackward);
    const int64_t c = config_.d_model, v = wte_.rows;
    LOOM_CHECK(ctx.dlogits.defined());
    LOOM_DISPATCH_FLOAT(ctx.dlogits.dtype(), T,
                        k::matmul_backward(static_cast<T*>(nullptr), wte_.table.grad().data<T>(), static_cast<T*>(nullptr),
                                           ctx.dlogits.data<T>(), ctx.head.x.data<T>(), wte_.table.value().data<T>(),
                                           ctx.head.x.numel() / c, c, v, k::WeightLayout::kMK, precision_));
  }
  for (int64_t l = hi; l-- > lo;) blocks_[l].backward_weight(ctx.blocks[l]);
}

void Gpt::backward_embed(const Tensor& dx, ModelCtx& model_ctx) const {
  const StepPartScope part(StepPart::kEdgesBackward);
  GptCtx& ctx = as_gpt(model_ctx);
  Tensor rows = dx;
  if (tp_.sequence_split()) {  // every row: wte's rows here may be looked up by any token
    tp_.seam->staging().reset();
    rows = tp_.seam->staging().alloc({ctx.b * ctx.t, config_.d_model}, dx.dtype());
    tp_.seam->all_gather(dx, rows);
  }
  wte_.backward(rows, ctx.wte);
  wpe_.backward(rows, ctx.wpe);
}

void Gpt::backward(ModelCtx& model_ctx, double scale) const {
  GptCtx& ctx = as_gpt(model_ctx);
  hooks_(-1, BlockPhase::kBackward);
  Tensor dx = backward_stage(0, config_.n_layer, backward_head(ctx, scale), ctx);
  backward_embed(dx, ctx);
  hooks_(-1, BlockPhase::kBackwardDone);
}

std::vector<int64_t> Gpt::block_offsets() const {
  // Blocks are registered after wte and wpe and before ln_f, each as one contiguous run; a
  // block this part does not hold is the empty range where it would be.
  std::vector<int64_t> offsets(static_cast<size_t>(config_.n_layer + 1), params_.numel());
  auto first_of = [&](const std::string& prefix) -> int64_t {
    for (const ParamInfo& p : params_.infos())
      if (p.name.starts_with(prefix)) return p.offset;
    return -1;
  };
  if (part_.head) offsets.back() = first_of("transformer.ln_f.");
  for (int64_t l = config_.n_layer; l-- > 0;)
    offsets[l] = holds_block(l) ? first_of("transformer.h." + std::to_string(l) + ".") : offsets[l + 1];
  return offsets;
}

double Gpt::forward_flops_per_token(int64_t t) const {
  // Of the whole model, whatever part this process holds: per block the matmul weights
  // c_attn 3C^2, attn.c_proj C^2, c_fc 4C^2, mlp.c_proj 4C^2; the tied head V x C.
  const auto c = static_cast<double>(config_.d_model), l = static_cast<double>(config_.n_layer);
  const double matmul_params = 12 * l * c * c + static_cast<double>(config_.vocab_size) * c;
  return 2 * matmul_params + 4.0 * l * c * static_cast<double>(t);
}

}  // namespace loom::nn
