// What attention.cu's WMMA kernels and attention_mma.cu's mma.sync kernels share: the block
// shape and the loads of q, k, v and dy tiles and of the rows' statistics into shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace loom::gpu::kern::tiles {

constexpr int kRows = 64;  // queries (or keys) a CUDA block takes
constexpr int kWarps = 4;  // each takes 16 of them
constexpr int kThreads = kWarps * 32;
// Row stride of a (64, HS) bf16 tile in shared memory: padded by 16 bytes, so that the 8
// rows a fragment load or ldmatrix reads fall in different banks.
template <int HS>
constexpr int kLd = HS + 8;

// Rows [r0, r0 + 64) of one head's HS columns at `col` of rows `ld` apart into tile (64, HS)
// at stride kLd, 16 bytes a load; rows at or past T read as 0.
template <int HS>
__device__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* base, int64_t ld, int64_t col, int r0, int t) {
  constexpr int kVecs = HS / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kVecs; i += kThreads) {
    const int r = i / kVecs, d = (i % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < t) v = *reinterpret_cast<const uint4*>(base + int64_t{r0 + r} * ld + col + d);
    *reinterpret_cast<uint4*>(tile + r * kLd<HS> + d) = v;
  }
}

// Head h's keys and values of rows [k0, k0 + 64) (qkv rows `ld` apart) into two tiles.
template <int HS>
__device__ void load_keys_values(__nv_bfloat16* ks, __nv_bfloat16* vs, const __nv_bfloat16* base, int64_t ld, int c,
                                 int h, int k0, int t) {
  load_tile<HS>(ks, base, ld, c + int64_t{h} * HS, k0, t);
  load_tile<HS>(vs, base, ld, 2 * int64_t{c} + int64_t{h} * HS, k0, t);
}

// lse and dpre of the 64 query rows from q0 (0 past T).
__device__ inline void load_row_stats(float* lse_s, float* dpre_s, const float* lse, const float* dpre, int q0, int t) {
  for (int i = static_cast<int>(threadIdx.x); i < kRows; i += kThreads) {
    lse_s[i] = q0 + i < t ? lse[q0 + i] : 0.0f;
    dpre_s[i] = q0 + i < t ? dpre[q0 + i] : 0.0f;
  }
}

}  // namespace loom::gpu::kern::tiles
