#include "kernels/optimizer.h"

#include <cmath>

#include "kernels/parallel.h"

namespace loom::kernels {

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWStep& s) {
  const T decay = static_cast<T>(1.0 - s.lr * s.weight_decay);
  // 1 - beta computed in double, as PyTorch passes it to its kernels.
  const T w1 = static_cast<T>(1.0 - s.beta1), b2 = static_cast<T>(s.beta2);
  const T w2 = static_cast<T>(1.0 - s.beta2);
  const T step_size = static_cast<T>(s.lr / (1.0 - std::pow(s.beta1, s.step)));
  const T bc2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(s.beta2, s.step)));
  const T eps = static_cast<T>(s.eps);
  // Chunks on the pool, or on the caller's thread for a small tensor (a LayerNorm's or a
  // bias's hundreds of values: forking for them cost more than their update; parallel.h).
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      T g = grad[i];
      T p = param[i] * decay;
      T mi = m[i] + (g - m[i]) * w1;
      T vi = v[i] * b2 + g * g * w2;
      m[i] = mi;
      v[i] = vi;
      param[i] = p - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  });
}

template <typename T>
void sgd_update(T* param, const T* grad, T* buf, int64_t n, double lr, double momentum,
                double weight_decay, bool first_step) {
  const T wd = static_cast<T>(weight_decay), mu = static_cast<T>(momentum);
  const T lr_t = static_cast<T>(lr);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      T g = grad[i] + wd * param[i];
      if (mu != T(0)) {
        g = first_step ? g : mu * buf[i] + g;
        buf[i] = g;
      }
      param[i] -= lr_t * g;
    }
  });
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t,
                                  const AdamWStep&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamWStep&);
template void sgd_update<float>(float*, const float*, float*, int64_t, double, double, double,
                                bool);
template void sgd_update<double>(double*, const double*, double*, int64_t, double, double,
                                 double, bool);

}  // namespace loom::kernels
