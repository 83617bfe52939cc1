// INT8 weights for inference (docs/serving.md, "INT8 weights"): per-output-channel symmetric
// int8 weights with f32 scales, and the matrix product that uses them.
// Legend: N rows, K in features, M out features.
//
// Quantization: channel j's weights w[.][j] become q = round(w / s_j), s_j = max |w[.][j]| /
// 127, q in [-127, 127]. A product quantizes each input row the same way (dynamic, per row:
// s_i = max |x_i| / 127), sums q_x * q_w in int32 (exact: no rounding, so no order to fix),
// and gives out[i][j] = float(acc) * (s_i * s_j) + bias[j]. Every path (AVX-512 VNNI, AVX2,
// the generic loop and the reference twin) computes the same integers and the same float
// steps, so the same bits on every CPU and for any thread count.
//
// Thread-safety: reentrant; threads split the output channels (one OpenMP pool; a call
// inside a parallel region runs on its caller's thread). set_int8_path() is process-wide:
// call it before starting work, from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace loom::kernels {

// K is padded with zeros to a multiple of this, so every kernel runs whole vectors.
constexpr int64_t kInt8Pad = 64;

struct Int8Weight {
  int64_t k = 0, m = 0;  // logical in and out features
  int64_t k_padded = 0;  // k rounded up to kInt8Pad
  // (M, k_padded) channel-major: channel j's K weights at [j * k_padded, ...), zeros past k.
  std::shared_ptr<int8_t[]> q;
  std::vector<float> scale;  // (M) s_j; 0 for a channel of zeros
  std::vector<int32_t> sum;  // (M) the sum of channel j's q (the VNNI path's unsigned offset)

  int8_t* channel(int64_t j) const { return q.get() + j * k_padded; }
  // The bytes this weight holds (the int8 values without padding, the scales).
  int64_t bytes() const { return k * m + 4 * m; }
};

// An empty weight of k x m, to be filled by channel (then finish_int8_weight).
Int8Weight make_int8_weight(int64_t k, int64_t m);
// Recomputes `sum` from q. REQUIRES: q filled, padding zero.
void finish_int8_weight(Int8Weight& w);
// w (K, M) for kKM, (M, K) for kMK, quantized per output channel.
Int8Weight quantize_int8(const float* w, int64_t k, int64_t m, WeightLayout layout);
// Channel j's weights as floats (q x s_j), written to out (K).
void dequantize_channel(const Int8Weight& w, int64_t j, float* out);

// out (N, M) = quantized(inp (N, K)) @ w + bias (M); bias may be null. gelu_out (N, M), when
// not null: gelu(out) (the same bits as gelu_forward over out after).
void int8_matmul_forward(float* out, const float* inp, const Int8Weight& w, const float* bias, int64_t n,
                         float* gelu_out = nullptr);

// Which kernel sums the int8 products. kAuto picks the fastest this CPU has (CPUID).
enum class Int8Path { kAuto, kVnni, kAvx2, kGeneric };
bool int8_path_supported(Int8Path path);
const char* int8_path_name(Int8Path path);
// Every path this CPU runs, fastest first (never kAuto).
std::vector<Int8Path> int8_supported_paths();
// Process-wide; throws loom::Error naming the missing feature when the CPU lacks it.
void set_int8_path(Int8Path path);
Int8Path int8_active_path();

namespace int8_detail {
// acc (rows x cols, row stride ldacc) = sum over p < kp of a[r][p] * w[c][p], where a[r] and
// w[c] are pointers to k_padded int8 values (a as signed; the VNNI kernel takes a + 128 as
// unsigned bytes and subtracts 128 x sum[c]). rows, cols in [1, 4].
using Int8KernelFn = void (*)(int64_t kp, const int8_t* const* a, const uint8_t* const* au, int rows,
                              const int8_t* const* w, const int32_t* sum, int cols, int32_t* acc, int64_t ldacc);
extern const Int8KernelFn kInt8Vnni;
extern const Int8KernelFn kInt8Avx2;
}  // namespace int8_detail

}  // namespace loom::kernels
