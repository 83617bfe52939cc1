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
// Thread-safety: reentrant; threads split the output channels, 64 at a time (one OpenMP
// pool; a call inside a parallel region runs on its caller's thread). set_int8_path() is process-wide:
// call it before starting work, from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace loom::kernels {

// K is padded with zeros to a multiple of kInt8Pad (the kernels take 4 values a step), M to
// a multiple of kInt8Group (the channels of one AVX-512 vector of int32 sums).
constexpr int64_t kInt8Pad = 4;
constexpr int64_t kInt8Group = 16;

struct Int8Weight {
  int64_t k = 0, m = 0;  // logical in and out features
  int64_t k_padded = 0;  // k rounded up to kInt8Pad
  int64_t m_padded = 0;  // m rounded up to kInt8Group
  // Groups of 16 channels, each k_padded x 16 bytes, in steps of 4 inputs: channel j's
  // weights p..p+3 (p a multiple of 4) are the 4 bytes at group(j / 16) + p x 16 + (j % 16) x 4.
  // One 64-byte load holds 4 inputs' weights of 16 channels: what VNNI's vpdpbusd multiplies
  // by 4 input bytes broadcast, giving 16 channels' sums with no horizontal add. Padding zero.
  std::shared_ptr<int8_t[]> q;
  std::vector<float> scale;  // (M) s_j; 0 for a channel of zeros
  std::vector<int32_t> sum;  // (m_padded) the sum of channel j's q (the VNNI path's unsigned offset)

  int8_t* group(int64_t g) const { return q.get() + g * k_padded * kInt8Group; }
  int8_t& at(int64_t j, int64_t p) const {
    return group(j / kInt8Group)[p / 4 * 4 * kInt8Group + j % kInt8Group * 4 + p % 4];
  }
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
// acc (rows x 16 groups, row stride ldacc) = the exact sums over p < kp of a[r][p] x w(c, p)
// for the 16 x groups channels whose groups start at w (Int8Weight::group), sum their weight
// sums. Row r of the input is k_padded signed values at a + r x lda; au holds the same + 128
// as unsigned bytes (the VNNI kernel's operand: it subtracts 128 x sum[c]), null for the
// other kernels. rows in [1, 8], groups in [1, 4].
using Int8KernelFn = void (*)(int64_t kp, const int8_t* a, const uint8_t* au, int64_t lda, int rows, const int8_t* w,
                              const int32_t* sum, int groups, int32_t* acc, int64_t ldacc);
extern const Int8KernelFn kInt8Vnni;
extern const Int8KernelFn kInt8Avx2;
}  // namespace int8_detail

}  // namespace loom::kernels
