// OpenBLAS, opened on first use (dlopen) rather than linked: linked, its constructor (CPU
// detection, buffer setup) cost every loom process 4.5 ms of a 12 ms start, `loom --version`
// included, measured on Zen 3; the suite starts loom over 4,000 times. Opened here it costs
// only the processes that ask for it (job.gemm = "openblas", `loom bench gemm`).
#pragma once

#include <cblas.h>

namespace loom {

// The entry points Loom calls, with OpenBLAS's own signatures.
struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_corename) corename = nullptr;
};

// The library, opened once (thread-safe), its threads set to compute_threads(): the OpenMP
// build CMake found (so BLAS and Loom's kernels share one OpenMP pool), else the soname.
// RuntimeError naming both and dlerror's reason when neither opens.
const OpenBlas& openblas();
// Whether openblas() has opened it (set_compute_threads then sets its threads too).
bool openblas_opened();

}  // namespace loom
