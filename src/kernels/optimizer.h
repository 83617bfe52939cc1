// Optimizer update kernels, elementwise over flat buffers (so any shard is a range).
#pragma once

#include <cstdint>

namespace loom::kernels {

struct AdamWStep {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;  // 1-based: the number of updates including this one
};

// PyTorch AdamW semantics (torch.optim.AdamW, foreach=False): decoupled decay
// p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2 v + (1-b2) g^2;
// p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWStep& s);

// PyTorch SGD semantics: g += wd p; buf = momentum buf + g (buf = g on the first step);
// p -= lr buf. first_step selects the buffer initialisation.
template <typename T>
void sgd_update(T* param, const T* grad, T* buf, int64_t n, double lr, double momentum,
                double weight_decay, bool first_step);

}  // namespace loom::kernels
