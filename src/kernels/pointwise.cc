#include "kernels/pointwise.h"

#include <algorithm>
#include <cmath>

#include "kernels/fast_math.h"
#include "kernels/parallel.h"
#include "kernels/precision.h"

namespace loom::kernels {
namespace {
template <typename T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)

template <typename T>
inline T gelu(T x) {
  const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + fast_tanh(u));
}

// gelu'(x) * dy.
template <typename T>
inline T gelu_grad(T x, T dy) {
  const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
  const T th = fast_tanh(u);
  const T sech2 = T(1) - th * th;
  const T du = kGeluScale<T> * (T(1) + T(3) * T(0.044715) * x * x);
  return (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du) * dy;
}

}  // namespace

template <typename T>
void gelu_forward_serial(T* out, const T* inp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  parallel_chunks(n, [&](int64_t lo, int64_t hi) { gelu_forward_serial(out + lo, inp + lo, hi - lo); });
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) dinp[i] = gelu_grad(inp[i], dout[i]);
  });
}

void gelu_backward_bits(float* dinp, const uint16_t* inp, DType format, const float* dout, int64_t n,
                        DType round_out) {
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
    constexpr int64_t kBlock = 512;  // inp's values converted a block at a time, in L1
    alignas(64) float x[kBlock];
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t len = std::min(kBlock, hi - b);
      load_half_serial(format, x, inp + b, len);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) dinp[b + i] = gelu_grad(x[i], dout[b + i]);
      round_serial(round_out, dinp + b, dinp + b, len);  // kF32: nothing
    }
  });
}

template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

void add_round(float* out, const float* a, const float* b, int64_t n, DType format) {
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
    round_serial(format, out + lo, out + lo, hi - lo);
  });
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_forward_serial<float>(float*, const float*, int64_t);
template void gelu_forward_serial<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);
template void add_forward<float>(float*, const float*, const float*, int64_t);
template void add_forward<double>(double*, const double*, const double*, int64_t);

}  // namespace loom::kernels
