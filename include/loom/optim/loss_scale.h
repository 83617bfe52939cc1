// Dynamic loss scaling for fp16 training (docs/numerics.md, "Mixed precision"): fp16
// gradients below 2^-24 vanish, so backward runs on the loss times a scale S, and the
// optimizer sees the gradients divided by S again. S halves whenever a step's gradients
// overflow (the step is skipped: no update), and doubles after `window` clean steps in a row.
// S stays a power of two, so scaling and unscaling are exact.
// Thread-safety: a value; one thread uses it.
#pragma once

#include <cstdint>

namespace loom::optim {

struct LossScaleConfig {
  double init = 65536;   // 2^16, as PyTorch's GradScaler
  int64_t window = 1000;  // clean steps before S doubles
  double min = 1;         // S may not fall below this (DeepSpeed's min_loss_scale)
  double max = 16777216;  // 2^24: beyond it a scaled gradient would overflow f32 itself
};

class LossScaler {
 public:
  // REQUIRES: init, min and max powers of two with min <= init <= max, window >= 1.
  explicit LossScaler(LossScaleConfig config = {});
  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_; }
  // After a step: overflow (its gradients were not finite, and it was skipped) halves S,
  // else a clean step counts towards doubling. Returns false when S would fall below min
  // (S is left at min): the gradients overflow however small the scale, and the caller stops.
  bool update(bool overflow);
  // A checkpoint's: scale a power of two in [min, max], clean_steps >= 0 (else InputError).
  void restore(double scale, int64_t clean_steps);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t clean_ = 0;
};

// Whether x is a power of two in [2^-126, 2^127] (as every loss scale is).
bool is_power_of_two(double x);

}  // namespace loom::optim
