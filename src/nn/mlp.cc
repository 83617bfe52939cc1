#include "loom/nn/mlp.h"

#include <cmath>

#include "loom/rng.h"
#include "nn/dispatch.h"

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
  Tensor h = x;
  for (size_t i = 0; i < fc_.size(); ++i) {
    h = fc_[i].forward(h, ctx.fc[i], ctx.arena);
    if (i + 1 < fc_.size()) h = Gelu().forward(h, ctx.act[i], ctx.arena);
  }
  ctx.logits = h;
  return h;
}

double MlpClassifier::forward(const Tensor& x, const Tensor& labels, MlpClassifierCtx& ctx) const {
  Tensor logits = forward_logits(x, ctx);
  return CrossEntropy().forward(logits, labels, ctx.loss, ctx.arena);
}

void MlpClassifier::backward(MlpClassifierCtx& ctx, double scale) const {
  Tensor d = CrossEntropy().backward(ctx.loss, scale);
  for (size_t i = fc_.size(); i-- > 0;) {
    d = fc_[i].backward(d, ctx.fc[i], ctx.arena, /*need_dx=*/i > 0);
    if (i > 0) d = Gelu().backward(d, ctx.act[i - 1], ctx.arena);
  }
}

}  // namespace loom::nn
