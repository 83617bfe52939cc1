#include "loom/optim/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/optimizer.h"
#include "loom/core/error.h"
#include "loom/core/dtype_dispatch.h"

namespace loom::optim {

bool DecayPolicy::decays(ParamKind kind) const {
  switch (kind) {
    case ParamKind::kWeight:
      return true;
    case ParamKind::kEmbedding:
      return decay_embeddings;
    case ParamKind::kBias:
    case ParamKind::kNorm:
      return decay_norms_and_biases;
  }
  return false;
}

namespace {

class AdamW : public Optimizer {
 public:
  AdamW(const OptimizerConfig& c, UpdateSpec spec)
      : c_(c),
        spec_(std::move(spec)),
        m_(Tensor::zeros({spec_.state_numel}, spec_.values.dtype())),
        v_(Tensor::zeros({spec_.state_numel}, spec_.values.dtype())) {}

  void step(double lr) override {
    ++steps_;
    for (const Segment& g : spec_.segments) {
      kernels::AdamWStep s{.lr = lr, .beta1 = c_.beta1, .beta2 = c_.beta2, .eps = c_.eps,
                           .weight_decay = c_.decay.decays(g.kind) ? c_.weight_decay : 0.0,
                           .step = steps_};
      LOOM_DISPATCH_FLOAT(spec_.values.dtype(), T,
                          kernels::adamw_update(spec_.values.data<T>() + g.value_offset,
                                                spec_.grads.data<T>() + g.grad_offset,
                                                m_.data<T>() + g.state_offset, v_.data<T>() + g.state_offset,
                                                g.numel, s));
    }
  }

  std::vector<std::pair<std::string, Tensor>> state() const override {
    return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
  }

 private:
  OptimizerConfig c_;
  UpdateSpec spec_;
  Tensor m_, v_;
};

class Sgd : public Optimizer {
 public:
  Sgd(const OptimizerConfig& c, UpdateSpec spec)
      : c_(c), spec_(std::move(spec)), buf_(Tensor::zeros({spec_.state_numel}, spec_.values.dtype())) {}

  void step(double lr) override {
    for (const Segment& g : spec_.segments) {
      double wd = c_.decay.decays(g.kind) ? c_.weight_decay : 0.0;
      LOOM_DISPATCH_FLOAT(spec_.values.dtype(), T,
                          kernels::sgd_update(spec_.values.data<T>() + g.value_offset,
                                              spec_.grads.data<T>() + g.grad_offset,
                                              buf_.data<T>() + g.state_offset, g.numel, lr,
                                              c_.momentum, wd, steps_ == 0));
    }
    ++steps_;
  }

  std::vector<std::pair<std::string, Tensor>> state() const override {
    return {{"momentum_buffer", buf_}};
  }

 private:
  OptimizerConfig c_;
  UpdateSpec spec_;
  Tensor buf_;
};

}  // namespace

UpdateSpec whole(const ParamSet& params) {
  UpdateSpec spec{.values = params.values(), .grads = params.grads(), .state_numel = params.numel()};
  for (const ParamInfo& p : params.infos())
    spec.segments.push_back({.kind = p.kind, .numel = p.numel, .value_offset = p.offset,
                             .grad_offset = p.offset, .state_offset = p.offset});
  return spec;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSet& params) {
  return make_optimizer(config, whole(params));
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, UpdateSpec spec) {
  if (config.kind == "adamw") return std::make_unique<AdamW>(config, std::move(spec));
  if (config.kind == "sgd") return std::make_unique<Sgd>(config, std::move(spec));
  throw InputError(cat("training.optimizer: expected \"adamw\" or \"sgd\", got \"", config.kind, "\""));
}

double lr_at(const ScheduleConfig& s, int64_t step) {
  if (step < s.warmup_steps)
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.decay == "constant") return s.lr;
  const int64_t span = std::max<int64_t>(1, s.total_steps - 1 - s.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  if (s.decay == "linear") return s.lr + (s.min_lr - s.lr) * progress;
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

namespace {
template <typename T>
double clip_grad_norm_impl(T* g, int64_t n, double max_norm) {
  // Fixed chunks, each summed in order, then the chunks in order: the same bits whatever
  // the thread count.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += double(g[i]) * g[i];
    partial[c] = s;
  }
  double norm = 0;
  for (double s : partial) norm += s;
  norm = std::sqrt(norm);
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {  // a non-finite norm leaves them to be named
    const T coef = static_cast<T>(max_norm / (norm + 1e-6));
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= coef;
  }
  return norm;
}
}  // namespace

double clip_grad_norm(const ParamSet& params, double max_norm) {
  double norm = 0;
  LOOM_DISPATCH_FLOAT(params.dtype(), T,
                      norm = clip_grad_norm_impl(params.grads().data<T>(), params.numel(), max_norm));
  return norm;
}

}  // namespace loom::optim
