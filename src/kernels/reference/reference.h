// Plain-loop twins of every kernel in src/kernels/: the test oracle and the readable
// definition of each op (STYLE.md rule 6). Same signatures as the fast kernels, in
// namespace loom::kernels::reference. Never optimized; never called outside tests and
// the tools that check the fast kernels.
// Legend: N rows, K in features, M out features, C channels, V vocab/classes,
// B batch, T time, NH heads, HS head size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/precision.h"

namespace loom::kernels::reference {

// C (m, n) = [C +] op(A) @ op(B), each element one chain of fused multiply-adds over
// p = 0 .. k-1 in order, starting from C or +0: the order Loom's GEMM keeps on every path
// (kernels/gemm/gemm.h), so its results equal these bit for bit.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T acc = accumulate ? c[i * ldc + j] : T(0);
      for (int64_t p = 0; p < k; ++p) {
        const T x = trans_a ? a[p * lda + i] : a[i * lda + p];
        const T y = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc = std::fma(x, y, acc);
      }
      c[i * ldc + j] = acc;
    }
}

// The 16-bit product (kernels/gemm/gemm.h, gemm_half): the chain above on the values the
// format holds. For bf16, vdpbf16ps's rules: operands and C read with subnormals as zero,
// each multiply-add's result written with subnormals as zero (k == 0 leaves C).
inline void gemm_half(DType format, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const bool bf16 = format == DType::kBF16;
  const auto operand = [&](float x) { return bf16 ? bf16_operand(x) : f16_operand(x); };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        const float x = operand(trans_a ? a[p * lda + i] : a[i * lda + p]);
        const float y = operand(trans_b ? b[j * ldb + p] : b[p * ldb + j]);
        acc = bf16 ? flush_subnormal(std::fma(x, y, flush_subnormal(acc))) : std::fma(x, y, acc);
      }
      c[i * ldc + j] = acc;
    }
}

// bf16 products on AMX tiles (kernels/gemm/amx.h, GemmPath::kAmx): tdpbf16ps's order as the
// Intel SDM gives it, not the chain above. k goes 32 values (16 pairs) at a time from p = 0;
// within each group the products of even p and those of odd p each make a chain of fused
// multiply-adds from +0, and C then gets (even + odd) added; every result rounded to
// nearest even and written with subnormals as zero, operands and C read so (k == 0 leaves
// C).
inline void gemm_half_amx(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t g = 0; g < k; g += 32) {
        float even = 0.0f, odd = 0.0f;
        for (int64_t p = g; p < std::min(g + 32, k); ++p) {
          const float x = bf16_operand(trans_a ? a[p * lda + i] : a[i * lda + p]);
          const float y = bf16_operand(trans_b ? b[j * ldb + p] : b[p * ldb + j]);
          float& sum = (p - g) % 2 == 0 ? even : odd;
          sum = flush_subnormal(std::fma(x, y, sum));
        }
        acc = flush_subnormal(flush_subnormal(acc) + flush_subnormal(even + odd));
      }
      c[i * ldc + j] = acc;
    }
}

template <typename T>
T weight_at(const T* w, int64_t kk, int64_t mm, int64_t k, int64_t m, WeightLayout layout) {
  return layout == WeightLayout::kKM ? w[kk * m + mm] : w[mm * k + kk];
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t k,
                    int64_t m, WeightLayout layout) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < m; ++o) {
      T acc = bias ? bias[o] : T(0);
      for (int64_t j = 0; j < k; ++j) acc += inp[i * k + j] * weight_at(weight, j, o, k, m, layout);
      out[i * m + o] = acc;
    }
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t n, int64_t k, int64_t m, WeightLayout layout) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      T acc = 0;
      for (int64_t o = 0; o < m; ++o) acc += dout[i * m + o] * weight_at(weight, j, o, k, m, layout);
      if (dinp) dinp[i * k + j] = acc;
    }
  for (int64_t j = 0; dweight && j < k; ++j)
    for (int64_t o = 0; o < m; ++o) {
      T acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += inp[i * k + j] * dout[i * m + o];
      (layout == WeightLayout::kKM ? dweight[j * m + o] : dweight[o * k + j]) += acc;
    }
  if (dbias)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < n; ++i) dbias[o] += dout[i * m + o];
}

// Symmetric int8 of n values (stride apart): the scale max |x| / 127 and q = round(x x 127 /
// max |x|) clamped to [-127, 127] (all 0 and scale 0 when every x is 0; all 0 and scale NaN
// when an x is not finite).
inline float quantize_int8_row(const float* x, int64_t n, int64_t stride, int8_t* q) {
  float amax = 0;
  bool nan = false;
  for (int64_t p = 0; p < n; ++p) {
    amax = std::max(amax, std::fabs(x[p * stride]));
    nan = nan || std::isnan(x[p * stride]);
  }
  if (nan || !(amax > 0) || !std::isfinite(amax)) {
    for (int64_t p = 0; p < n; ++p) q[p] = 0;
    return !nan && std::isfinite(amax) ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / amax;
  for (int64_t p = 0; p < n; ++p) q[p] = static_cast<int8_t>(std::clamp(std::nearbyint(x[p * stride] * inv), -127.0f, 127.0f));
  return amax / 127.0f;
}

// The int8 product (kernels/int8_matmul.h) from the f32 weight: each output channel of
// `weight` quantized, each input row quantized, their products summed in int32, then
// out = fma(float(sum), s_row x s_channel, bias).
inline void int8_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t n,
                                int64_t k, int64_t m, WeightLayout layout) {
  std::vector<int8_t> qw(static_cast<size_t>(k * m)), qx(static_cast<size_t>(k));
  std::vector<float> sw(static_cast<size_t>(m));
  for (int64_t o = 0; o < m; ++o)
    sw[o] = layout == WeightLayout::kKM ? quantize_int8_row(weight + o, k, m, qw.data() + o * k)
                                        : quantize_int8_row(weight + o * k, k, 1, qw.data() + o * k);
  for (int64_t i = 0; i < n; ++i) {
    const float sx = quantize_int8_row(inp + i * k, k, 1, qx.data());
    for (int64_t o = 0; o < m; ++o) {
      int32_t acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += int32_t{qx[j]} * int32_t{qw[o * k + j]};
      out[i * m + o] = std::fma(static_cast<float>(acc), sx * sw[o], bias ? bias[o] : 0.0f);
    }
  }
}

template <typename T>
T gelu(T x) {
  const T s = std::sqrt(T(2) / T(3.14159265358979323846));
  return T(0.5) * x * (T(1) + std::tanh(s * (x + T(0.044715) * x * x * x)));
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T s = std::sqrt(T(2) / T(3.14159265358979323846));
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T th = std::tanh(s * (x + T(0.044715) * x * x * x));
    T d = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * s * (T(1) + T(0.134145) * x * x);
    dinp[i] = d * dout[i];
  }
}

template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    T m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += inp[i * c + j];
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (inp[i * c + j] - m) * (inp[i * c + j] - m);
    T s = T(1) / std::sqrt(v / c + T(1e-5));
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = (inp[i * c + j] - m) * s * weight[j] + bias[j];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    T a = 0, b = 0;
    for (int64_t j = 0; j < c; ++j) {
      T xhat = (inp[i * c + j] - mean[i]) * rstd[i];
      a += dout[i * c + j] * weight[j];
      b += dout[i * c + j] * weight[j] * xhat;
      dweight[j] += dout[i * c + j] * xhat;
      dbias[j] += dout[i * c + j];
    }
    for (int64_t j = 0; j < c; ++j) {
      T xhat = (inp[i * c + j] - mean[i]) * rstd[i];
      dinp[i * c + j] = rstd[i] * (dout[i * c + j] * weight[j] - a / c - xhat * b / c);
    }
  }
}

// The attention probabilities of one head's row i, whole: p[j] for j <= i, zero after;
// returns the row's log-sum-exp of its scaled scores.
template <typename T>
T attention_row(T* p, const T* qkv, int64_t bi, int64_t h, int64_t i, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(T(hs));
  const T* q = qkv + (bi * t + i) * 3 * c + h * hs;
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < t; ++j) {
    p[j] = 0;
    if (j > i) continue;
    const T* k = qkv + (bi * t + j) * 3 * c + c + h * hs;
    T dot = 0;
    for (int64_t d = 0; d < hs; ++d) dot += q[d] * k[d];
    p[j] = dot * scale;
    mx = std::max(mx, p[j]);
  }
  T sum = 0;
  for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
  return mx + std::log(sum);
}

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  std::vector<T> p(t);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < t; ++i) {
        lse[(bi * nh + h) * t + i] = attention_row(p.data(), qkv, bi, h, i, t, c, nh);
        for (int64_t d = 0; d < hs; ++d) {
          T acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[j] * qkv[(bi * t + j) * 3 * c + 2 * c + h * hs + d];
          out[(bi * t + i) * c + h * hs + d] = acc;
        }
      }
}

// The textbook softmax backward on whole rows (dot = sum_j P_ij dP_ij; out and lse unused).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* /*out*/, const T* /*lse*/, int64_t b,
                        int64_t t, int64_t c, int64_t nh) {
  int64_t hs = c / nh;
  T scale = T(1) / std::sqrt(T(hs));
  std::fill(dqkv, dqkv + b * t * 3 * c, T(0));
  std::vector<T> dp(t), p(t);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < t; ++i) {
        attention_row(p.data(), qkv, bi, h, i, t, c, nh);
        const T* dy = dout + (bi * t + i) * c + h * hs;
        T dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* v = qkv + (bi * t + j) * 3 * c + 2 * c + h * hs;
          T* dv = dqkv + (bi * t + j) * 3 * c + 2 * c + h * hs;
          dp[j] = 0;
          for (int64_t d = 0; d < hs; ++d) {
            dp[j] += dy[d] * v[d];
            dv[d] += p[j] * dy[d];
          }
          dot += p[j] * dp[j];
        }
        const T* q = qkv + (bi * t + i) * 3 * c + h * hs;
        T* dq = dqkv + (bi * t + i) * 3 * c + h * hs;
        for (int64_t j = 0; j <= i; ++j) {
          T ds = p[j] * (dp[j] - dot) * scale;
          const T* k = qkv + (bi * t + j) * 3 * c + c + h * hs;
          T* dk = dqkv + (bi * t + j) * 3 * c + c + h * hs;
          for (int64_t d = 0; d < hs; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
}

template <typename T>
void attention_decode(T* out, const T* q, int64_t ldq, const T* const* kpages, const T* const* vpages, int64_t page,
                      int64_t past, int64_t n, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  auto key = [&](int64_t j, int64_t d) { return kpages[j / page][(j % page) * c + d]; };
  auto value = [&](int64_t j, int64_t d) { return vpages[j / page][(j % page) * c + d]; };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t len = past + i + 1;
      std::vector<T> s(static_cast<size_t>(len));
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        T dot = 0;
        for (int64_t d = 0; d < hs; ++d) dot += q[i * ldq + h * hs + d] * key(j, h * hs + d);
        s[j] = dot / std::sqrt(static_cast<T>(hs));
        mx = std::max(mx, s[j]);
      }
      T sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int64_t d = 0; d < hs; ++d) {
        T y = 0;
        for (int64_t j = 0; j < len; ++j) y += s[j] / sum * value(j, h * hs + d);
        out[i * c + h * hs + d] = y;
      }
    }
}

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n,
                           int64_t v) {
  for (int64_t i = 0; i < n; ++i) {
    T mx = logits[i * v];
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, logits[i * v + j]);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[i * v + j] - mx);
    losses[i] = -(logits[i * v + targets[i]] - mx - std::log(sum));
  }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T dloss,
                            int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; ++i) {
    T mx = logits[i * v];
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, logits[i * v + j]);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[i * v + j] - mx);
    for (int64_t j = 0; j < v; ++j)
      dlogits[i * v + j] = (std::exp(logits[i * v + j] - mx) / sum - (j == targets[i])) * dloss;
  }
}

// The vocab-parallel pieces of the above (kernels/cross_entropy.h): a piece holds columns
// [v_begin, v_begin + v) of each row.
template <typename T>
void cross_entropy_slice_max(T* mx, const T* logits, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; ++i) {
    mx[i] = logits[i * v];
    for (int64_t j = 0; j < v; ++j) mx[i] = std::max(mx[i], logits[i * v + j]);
  }
}

template <typename T>
void cross_entropy_slice_sums(T* sums, const T* logits, const int32_t* targets, const T* mx, int64_t n, int64_t v,
                              int64_t v_begin) {
  for (int64_t i = 0; i < n; ++i) {
    sums[i] = 0;
    for (int64_t j = 0; j < v; ++j) sums[i] += std::exp(logits[i * v + j] - mx[i]);
    const bool mine = targets[i] >= v_begin && targets[i] < v_begin + v;
    sums[n + i] = mine ? logits[i * v + targets[i] - v_begin] : T(0);
  }
}

template <typename T>
void cross_entropy_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* mx, const T* sum,
                                  T dloss, int64_t n, int64_t v, int64_t v_begin) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j)
      dlogits[i * v + j] = (std::exp(logits[i * v + j] - mx[i]) / sum[i] - (j + v_begin == targets[i])) * dloss;
}

// Distillation over a piece of the columns (kernels/distill.h).
template <typename T>
void distill_slice_sums(T* sums, const T* logits, const T* soft, const T* mx, int64_t n, int64_t v, T temp) {
  for (int64_t i = 0; i < n; ++i) {
    sums[i] = sums[n + i] = sums[2 * n + i] = 0;
    for (int64_t j = 0; j < v; ++j) {
      const T z = logits[i * v + j], p = soft[i * v + j];
      sums[i] += std::exp((z - mx[i]) / temp);
      sums[n + i] += p * z;
      if (p > 0) sums[2 * n + i] += p * std::log(p);
    }
  }
}

template <typename T>
void distill_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* soft, const T* mx, const T* sum,
                            const T* sum_t, T dloss, T alpha, T temp, int64_t n, int64_t v, int64_t v_begin) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j) {
      const T z = logits[i * v + j];
      const T hard = std::exp(z - mx[i]) / sum[i] - (j + v_begin == targets[i]);
      const T kd = std::exp((z - mx[i]) / temp) / sum_t[i] - soft[i * v + j];
      dlogits[i * v + j] = dloss * ((T(1) - alpha) * hard + alpha * temp * kd);
    }
}

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = ids[i] < 0 ? T(0) : table[ids[i] * c + j];
}

template <typename T>
void embedding_backward(T* dtable, const int32_t* ids, const T* dout, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c && ids[i] >= 0; ++j) dtable[ids[i] * c + j] += dout[i * c + j];
}

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWStep& s) {
  for (int64_t i = 0; i < n; ++i) {
    double p = param[i] * (1.0 - s.lr * s.weight_decay);
    double mi = s.beta1 * m[i] + (1.0 - s.beta1) * grad[i];
    double vi = s.beta2 * v[i] + (1.0 - s.beta2) * grad[i] * grad[i];
    double mhat = mi / (1.0 - std::pow(s.beta1, s.step));
    double vhat = vi / (1.0 - std::pow(s.beta2, s.step));
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    param[i] = static_cast<T>(p - s.lr * mhat / (std::sqrt(vhat) + s.eps));
  }
}

template <typename T>
void sgd_update(T* param, const T* grad, T* buf, int64_t n, double lr, double momentum,
                double weight_decay, bool first_step) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] + T(weight_decay) * param[i];
    if (momentum != 0) buf[i] = g = first_step ? g : T(momentum) * buf[i] + g;
    param[i] -= T(lr) * g;
  }
}

}  // namespace loom::kernels::reference
