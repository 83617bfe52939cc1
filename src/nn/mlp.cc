#include "loom/nn/mlp.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/dtype_dispatch.h"

namespace loom::nn {

MlpClassifier::MlpClassifier(const MlpConfig& config, DType dtype)
    : config_(config), params_(dtype) {
  int64_t in = config.inputs;
  for (int64_t i = 0; i <= config.n_hidden; ++i) {
    int64_t out = i == config.n_hidden ? config.classes : config.hidden;
    fc_.emplace_back(params_, "fc" + std::to_string(i), in, out);
    in = out;
  }
  params_.allocate();
}

void MlpClassifier::init(uint64_t seed) {
  Rng rng(seed, /*stream=*/1);
  for (const Linear& l : fc_) {
    double bound = 1.0 / std::sqrt(static_cast<double>(l.in));
    for (const ParamRef& p : {l.weight, l.bias}) {
      Tensor v = p.value();
      LOOM_DISPATCH_FLOAT(v.dtype(), T, {
        T* d = v.data<T>();
        for (int64_t j = 0; j < v.numel(); ++j)
          d[j] = static_cast<T>((2.0 * rng.uniform() - 1.0) * bound);
      });
    }
  }
}

namespace {
MlpClassifierCtx& as_mlp(ModelCtx& ctx) {
  auto* m = dynamic_cast<MlpClassifierCtx*>(&ctx);
  LOOM_CHECK(m != nullptr);  // a context another kind of model made
  return *m;
}
}  // namespace

ModelShape MlpClassifier::shape() const {
  return {.kind = "mlp",
          .fields = {{"inputs", config_.inputs}, {"hidden", config_.hidden}, {"n_hidden", config_.n_hidden},
                     {"classes", config_.classes}}};
}

void MlpClassifier::begin(ModelCtx& model_ctx, int64_t /*b*/, int64_t /*t*/) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  ctx.arena.reset();
  ctx.fc.resize(fc_.size());
  ctx.act.resize(fc_.size() - 1);
}

Tensor MlpClassifier::forward_stage(int64_t lo, int64_t hi, const Tensor& x, ModelCtx& model_ctx) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  Tensor h = x;
  for (auto i = static_cast<size_t>(lo); i < static_cast<size_t>(hi); ++i) {
    hooks_(static_cast<int>(i), BlockPhase::kForward);
    h = fc_[i].forward(h, ctx.fc[i], ctx.arena);
    hooks_(static_cast<int>(i), BlockPhase::kForwardDone);
    if (i + 1 < fc_.size()) h = Gelu().forward(h, ctx.act[i], ctx.arena);
  }
  return h;
}

Tensor MlpClassifier::forward_logits(const Tensor& x, MlpClassifierCtx& ctx) const {
  begin(ctx, x.dim(0), 1);
  hooks_(-1, BlockPhase::kForward);
  ctx.logits = forward_stage(0, n_blocks(), embed(x, ctx), ctx);
  hooks_(-1, BlockPhase::kForwardDone);
  return ctx.logits;
}

double MlpClassifier::head(const Tensor& logits, const Tensor& labels, ModelCtx& model_ctx) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  ctx.logits = logits;
  return CrossEntropy().forward(logits, labels, ctx.loss, ctx.arena);
}

double MlpClassifier::forward(const Tensor& x, const Tensor& labels, ModelCtx& model_ctx) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  return head(forward_logits(x, ctx), labels, ctx);
}

EvalSums MlpClassifier::evaluate(const Tensor& x, const Tensor& labels, ModelCtx& model_ctx) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  EvalSums r{.loss = forward(x, labels, ctx), .correct = 0};
  const float* logits = ctx.logits.data<float>();
  const int64_t k = config_.classes;
  for (int64_t i = 0; i < x.dim(0); ++i) {
    const float* row = logits + i * k;
    if (std::max_element(row, row + k) - row == labels.data<int32_t>()[i]) ++r.correct;
  }
  return r;
}

Tensor MlpClassifier::backward_head(ModelCtx& model_ctx, double scale, bool /*defer_weights*/) const {
  return CrossEntropy().backward(as_mlp(model_ctx).loss, scale);
}

// Block i's backward begins with the GELU after it (which forward_stage ran with block i).
Tensor MlpClassifier::backward_stage(int64_t lo, int64_t hi, const Tensor& dy, ModelCtx& model_ctx,
                                     bool /*defer_weights*/) const {
  MlpClassifierCtx& ctx = as_mlp(model_ctx);
  Tensor d = dy;
  for (auto i = static_cast<size_t>(hi); i-- > static_cast<size_t>(lo);) {
    if (i + 1 < fc_.size()) d = Gelu().backward(d, ctx.act[i], ctx.arena);
    hooks_(static_cast<int>(i), BlockPhase::kBackward);
    d = fc_[i].backward(d, ctx.fc[i], ctx.arena, /*need_dx=*/i > 0);
    hooks_(static_cast<int>(i), BlockPhase::kBackwardDone);
  }
  return d;
}

void MlpClassifier::backward(ModelCtx& ctx, double scale) const {
  hooks_(-1, BlockPhase::kBackward);
  backward_stage(0, n_blocks(), backward_head(ctx, scale), ctx);
  hooks_(-1, BlockPhase::kBackwardDone);
}

CrossEntropyCtx& MlpClassifier::loss_ctx(ModelCtx& ctx) const { return as_mlp(ctx).loss; }

std::vector<int64_t> MlpClassifier::block_offsets() const {
  std::vector<int64_t> offsets;
  for (const Linear& l : fc_) offsets.push_back(l.weight.info().offset);  // weight, then bias
  offsets.push_back(params_.numel());
  return offsets;
}

}  // namespace loom::nn
