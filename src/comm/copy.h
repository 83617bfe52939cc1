// Byte copies for the collectives' buffers. Internal to src/comm/.
#pragma once

#include <cstddef>

namespace loom::comm {

// memmove that accepts null pointers when n == 0 (empty ops pass null buffers), and that
// does not fall into glibc's slow case: on AMD Zen 3 its `rep movsb` copies 64-256 KiB at
// about 2 GB/s, against 30-40 at any other placement, when the destination lies 1-63 bytes
// past the source modulo 4 KiB, which is where a malloc'd buffer (16 bytes past a page)
// meets a page-aligned shared slot. Such copies, when the ranges do not overlap and glibc
// would use `rep movsb` (2 KiB up to its stop threshold, the L2 size on AMD), take a vector
// loop with cache-line-aligned stores instead (23-39 GB/s measured there); every other copy
// is memmove.
void copy_bytes(void* dst, const void* src, size_t n);

// memcpy with non-temporal stores: whole 64-byte lines go to memory without first being
// read for ownership, and lines another core caches are only invalidated. Ordered before
// any later store (ends with a store fence).
void stream_copy(void* dst, const void* src, size_t n);

// Copies n bytes from src to both a and b in one pass, loading each byte once (a rank's
// own part of an all_gather goes to its slot and its output together). stream_a: a gets
// non-temporal stores; stream_b: b does, where it lies a multiple of 16 bytes from a (else
// ordinary stores). Ends with a store fence when either streams. The ranges must not
// overlap.
void tee_copy(void* a, void* b, const void* src, size_t n, bool stream_a, bool stream_b);

}  // namespace loom::comm
