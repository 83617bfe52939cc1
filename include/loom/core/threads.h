// Compute thread control. Loom runs every kernel and every GEMM on one OpenMP pool (the
// OpenBLAS build it links is the OpenMP one), sized explicitly per process: a second pool
// spinning against the first costs 2.4x on 2 cores (../shared/peers/README.md).
//
// Thread-safety: call set_compute_threads() before starting work, from one thread.
#pragma once

namespace loom {

// Sizes both Loom's OpenMP pool and OpenBLAS. REQUIRES: n >= 1.
void set_compute_threads(int n);
int compute_threads();

}  // namespace loom
