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
// pool, as kernels/parallel.h decides: a call inside a parallel region, on a team of one or
// on little work runs on its caller's thread). set_int8_path() is process-wide:
// call it before starting work, from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace loom::kernels {

// K is padded with zeros to a multiple of kInt8Pad (the kernels take 4 inputs a step), M to
// a multiple of kInt8Tile (the channels one kernel call sums: 4 AVX-512 vectors of 16 int32).
constexpr int64_t kInt8Pad = 4;
constexpr int64_t kInt8Tile = 64;

struct Int8Weight {
  int64_t k = 0, m = 0;  // logical in and out features
  int64_t k_padded = 0;  // k rounded up to kInt8Pad
  int64_t m_padded = 0;  // m rounded up to kInt8Tile
  // Tiles of 64 channels, each k_padded x 64 bytes, in steps of 4 inputs: step p / 4 of a
  // tile is 256 bytes, channel c's weights p..p+3 at c x 4 (c the channel within the tile).
  // So 64 bytes hold 4 inputs' weights of 16 channels (what VNNI's vpdpbusd multiplies by 4
  // input bytes broadcast, giving 16 channels' sums with no horizontal add), and a tile is
  // read as one stream. Padding zero.
  std::shared_ptr<int8_t[]> q;
  std::vector<float> scale;  // (M) s_j; 0 for a channel of zeros
  std::vector<int32_t> sum;  // (m_padded) the sum of channel j's q (the VNNI path's unsigned offset)

  int8_t* tile(int64_t t) const { return q.get() + t * k_padded * kInt8Tile; }
  int8_t& at(int64_t j, int64_t p) const {
    return tile(j / kInt8Tile)[p / 4 * 4 * kInt8Tile + j % kInt8Tile * 4 + p % 4];
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

// Where a kernel call's sums go, as floats: out[r][c] = fma(float(sum[r][c]), sa[r] x sw[c],
// bias[c]) (+0 for no bias) for its rows r and the tile's first `cols` channels c.
struct Int8Out {
  float* out;          // row 0, channel 0 of the tile; rows ldout apart
  int64_t ldout;
  const float* sa;     // the rows' scales
  const float* sw;     // the channels' scales (cols)
  const float* bias;   // the channels' biases (cols), or null
  int64_t cols;        // 1 to kInt8Tile: fewer in the last tile when m is not a multiple
};

// The exact sums over p < kp of a[r][p] x w(c, p) for the 64 channels of the tile at w
// (Int8Weight::tile), sum their weight sums, written to `to` as Int8Out says. Row r of the
// input is k_padded signed values at a + r x lda; au holds the same + 128 as unsigned bytes
// (the VNNI kernel's operand: it subtracts 128 x sum[c]), null for the other kernels. rows
// in [1, kInt8MaxRows].
constexpr int kInt8MaxRows = 6;  // VNNI's sums of 6 rows x 64 channels fill 24 registers
using Int8KernelFn = void (*)(int64_t kp, const int8_t* a, const uint8_t* au, int64_t lda, int rows, const int8_t* w,
                              const int32_t* sum, const Int8Out& to);
extern const Int8KernelFn kInt8Vnni;
extern const Int8KernelFn kInt8Avx2;

// Int8Out's float steps for sums already in int32 (acc: rows x cols, rows ldacc apart): the
// AVX2 and generic kernels', and VNNI's in a tile of fewer than 64 channels.
void finish_rows(const int32_t* acc, int64_t ldacc, int rows, const Int8Out& to);
}  // namespace int8_detail

}  // namespace loom::kernels
