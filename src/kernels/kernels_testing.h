// Helpers of the kernel tests (kernels_test.cc, attention_test.cc): random inputs and
// central-difference gradients.
#pragma once

#include <functional>
#include <vector>

#include "loom/core/rng.h"
#include "loom_testing.h"

namespace loom::kernels {

inline std::vector<double> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}

inline std::vector<float> to_f32(const std::vector<double>& v) { return {v.begin(), v.end()}; }

using loom::testing::rel_err;

// Numerical gradient of L(x) = sum(f(x) * w) with central differences.
inline std::vector<double> numeric_grad(std::vector<double> x, const std::vector<double>& w,
                                 const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  const double h = 1e-5;
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    auto yp = f(x);
    x[i] = x0 - h;
    auto ym = f(x);
    x[i] = x0;
    double d = 0;
    for (size_t j = 0; j < w.size(); ++j) d += (yp[j] - ym[j]) * w[j];
    g[i] = d / (2 * h);
  }
  return g;
}

}  // namespace loom::kernels
