// The AMX micro-kernel of bf16 products (amx.h has the layout and the arithmetic): C's 32 x 32
// block in four 16 x 16 f32 tiles, two tiles of A (16 rows of 16 pairs each) and two of B (16
// pairs of 16 columns each) per step of 32 k values, four tdpbf16ps a step. Compiled with
// -mamx-tile -mamx-bf16 (src/kernels/CMakeLists.txt) and only ever called after
// gemm_path_supported(kAmx): CPUID reports AMX-TILE and AMX-BF16, the OS manages the tile
// state and Linux granted this process its use (paths.cc).
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/gemm/amx.h"

namespace loom::kernels::gemm_detail {
namespace {

// Palette 1 with tiles 0-7 all 16 rows of 64 bytes: 0-3 C, 4-5 A, 6-7 B.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tile configuration is per thread (saved with the thread's state): loaded once by each
// thread that multiplies.
void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

// Bytes between the rows of a local C, of an A sliver's tile rows, of a B sliver's rows.
constexpr int64_t kCStride = kAmxCols * sizeof(float);
constexpr int64_t kAStride = kAmxPairs * sizeof(uint32_t);
constexpr int64_t kBStride = kAmxCols * sizeof(uint32_t);

// flush_subnormal's test, here rather than precision.h's inline copy: an out-of-line copy
// compiled for AMX and AVX-512 could be the one the linker keeps for every caller.
float flushed(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return (u & 0x7f800000u) == 0 ? std::bit_cast<float>(u & 0x80000000u) : x;
}

// The four products of one step: A's two tiles by B's two.
inline void step_tiles(const uint32_t* a, const uint32_t* b) {
  _tile_loadd(4, a, kAStride);
  _tile_loadd(5, a + 16 * kAmxPairs, kAStride);
  _tile_loadd(6, b, kBStride);
  _tile_loadd(7, b + 16, kBStride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

void amx_kernel(int64_t depth, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, const float* from,
                int64_t ld_from) {
  configure_tiles();
  if (from != nullptr) {
    // The start's subnormals read as zero, through a local copy the tiles load: the SDM has
    // the instruction read C so too, and this way the twin's reading does not rest on it.
    alignas(64) float start[kAmxRows * kAmxCols];
    for (int r = 0; r < kAmxRows; ++r)
      for (int j = 0; j < kAmxCols; ++j) start[r * kAmxCols + j] = flushed(from[r * ld_from + j]);
    _tile_loadd(0, start, kCStride);
    _tile_loadd(1, start + 16, kCStride);
    _tile_loadd(2, start + 16 * kAmxCols, kCStride);
    _tile_loadd(3, start + 16 * kAmxCols + 16, kCStride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t full = depth / kAmxPairs, rest = depth % kAmxPairs;
  for (int64_t s = 0; s < full; ++s) step_tiles(a + s * kAmxRows * kAmxPairs, b + s * kAmxPairs * kAmxCols);
  if (rest) {  // the last pairs, padded to a step with pairs whose products are -0
    alignas(64) uint32_t ta[kAmxRows * kAmxPairs], tb[kAmxPairs * kAmxCols];
    const uint32_t* ar = a + full * kAmxRows * kAmxPairs;  // row after row, `rest` pairs each
    const uint32_t* br = b + full * kAmxPairs * kAmxCols;
    for (int r = 0; r < kAmxRows; ++r)
      for (int q = 0; q < kAmxPairs; ++q) ta[r * kAmxPairs + q] = q < rest ? ar[r * rest + q] : kAmxPadA << 16 | kAmxPadA;
    for (int q = 0; q < kAmxPairs; ++q)
      for (int j = 0; j < kAmxCols; ++j) tb[q * kAmxCols + j] = q < rest ? br[q * kAmxCols + j] : kAmxPadB;
    step_tiles(ta, tb);
  }
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * ldc, stride);
  _tile_stored(3, c + 16 * ldc + 16, stride);
}

// The core's tdpbf16ps peak: four independent accumulator tiles, register (tile) operands
// only; each instruction 16 x 16 x 32 multiply-adds.
double amx_dot_loop(int64_t iters, float* sink) {
  configure_tiles();
  alignas(64) uint32_t x[16 * kAmxPairs];
  for (uint32_t& v : x) v = 0x33d633d6u;  // small values: the sums stay far from overflow
  _tile_loadd(4, x, kAStride);
  _tile_loadd(5, x, kAStride);
  _tile_loadd(6, x, kAStride);
  _tile_loadd(7, x, kAStride);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  *sink += out[0];
  return 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(iters);
}

}  // namespace

const MicroKernel<uint32_t, float> kAmxKernel = {"amx", kAmxRows, kAmxCols, kAmxKc, kAmxMc, kAmxNc, kAmxMc,
                                                 amx_kernel, amx_dot_loop, nullptr, nullptr};

}  // namespace loom::kernels::gemm_detail
