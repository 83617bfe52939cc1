#include "loom/nn/mlp.h"

#include <cmath>

#include "loom/rng.h"
#include "loom/dtype_dispatch.h"

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

Tensor MlpClassifier::forward_logits(const Tensor& x, MlpClassifierCtx& ctx) const {
  ctx.arena.reset();
  ctx.fc.resize(fc_.size());
  ctx.act.resize(fc_.size() - 1);
  if (on_block) on_block(-1, BlockPhase::kForward);
  Tensor h = x;
  for (size_t i = 0; i < fc_.size(); ++i) {
    if (on_block) on_block(static_cast<int>(i), BlockPhase::kForward);
    h = fc_[i].forward(h, ctx.fc[i], ctx.arena);
    if (on_block) on_block(static_cast<int>(i), BlockPhase::kForwardDone);
    if (i + 1 < fc_.size()) h = Gelu().forward(h, ctx.act[i], ctx.arena);
  }
  ctx.logits = h;
  if (on_block) on_block(-1, BlockPhase::kForwardDone);
  return h;
}

double MlpClassifier::forward(const Tensor& x, const Tensor& labels, MlpClassifierCtx& ctx) const {
  Tensor logits = forward_logits(x, ctx);
  return CrossEntropy().forward(logits, labels, ctx.loss, ctx.arena);
}

void MlpClassifier::backward(MlpClassifierCtx& ctx, double scale) const {
  if (on_block) on_block(-1, BlockPhase::kBackward);
  Tensor d = CrossEntropy().backward(ctx.loss, scale);
  for (size_t i = fc_.size(); i-- > 0;) {
    if (on_block) on_block(static_cast<int>(i), BlockPhase::kBackward);
    d = fc_[i].backward(d, ctx.fc[i], ctx.arena, /*need_dx=*/i > 0);
    if (on_block) on_block(static_cast<int>(i), BlockPhase::kBackwardDone);
    if (i > 0) d = Gelu().backward(d, ctx.act[i - 1], ctx.arena);
  }
  if (on_block) on_block(-1, BlockPhase::kBackwardDone);
}

std::vector<int64_t> MlpClassifier::block_offsets() const {
  std::vector<int64_t> offsets;
  for (const Linear& l : fc_) offsets.push_back(l.weight.info().offset);  // weight, then bias
  offsets.push_back(params_.numel());
  return offsets;
}

}  // namespace loom::nn
