#include "loom/optim/loss_scale.h"

#include <cmath>

#include "loom/core/error.h"

namespace loom::optim {

bool is_power_of_two(double x) {
  if (!(x > 0) || !std::isfinite(x)) return false;
  int e = 0;
  return std::frexp(x, &e) == 0.5 && e >= -125 && e <= 128;
}

LossScaler::LossScaler(LossScaleConfig config) : config_(config), scale_(config.init) {
  LOOM_CHECK(is_power_of_two(config.init) && is_power_of_two(config.min) && is_power_of_two(config.max));
  LOOM_CHECK(config.min <= config.init && config.init <= config.max && config.window >= 1);
}

bool LossScaler::update(bool overflow) {
  if (overflow) {
    clean_ = 0;
    if (scale_ / 2 < config_.min) return false;
    scale_ /= 2;
    return true;
  }
  if (++clean_ >= config_.window) {
    clean_ = 0;
    if (scale_ * 2 <= config_.max) scale_ *= 2;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t clean_steps) {
  if (!is_power_of_two(scale) || scale < config_.min || scale > config_.max)
    throw InputError(cat("loss scale ", scale, ": expected a power of two in [", config_.min, ", ", config_.max, "]"));
  if (clean_steps < 0) throw InputError(cat("loss scale clean steps ", clean_steps, ": expected >= 0"));
  scale_ = scale;
  clean_ = clean_steps;
}

}  // namespace loom::optim
