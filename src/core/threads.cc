#include "loom/core/threads.h"

#include <omp.h>

#include "core/openblas.h"
#include "loom/core/error.h"

namespace loom {

void set_compute_threads(int n) {
  LOOM_CHECK_LE(1, n);
  omp_set_num_threads(n);
  if (openblas_opened()) openblas().set_num_threads(n);
}

int compute_threads() { return omp_get_max_threads(); }

}  // namespace loom
