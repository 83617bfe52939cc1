#include "core/openblas.h"

#include <atomic>
#include <string>

#include "core/dl_library.h"
#include "loom/core/threads.h"

namespace loom {
namespace {

std::atomic<bool> g_opened{false};

OpenBlas open_openblas() {
  std::string reason;
  const std::optional<DlLibrary> lib = DlLibrary::open("OpenBLAS", {LOOM_OPENBLAS_PATH, "libopenblas.so.0"}, &reason);
  if (!lib)
    throw RuntimeError(cat("OpenBLAS did not open as ", LOOM_OPENBLAS_PATH, " or libopenblas.so.0: ", reason,
                           " (Debian: apt-get install libopenblas0-openmp)"));
  OpenBlas b;
  lib->resolve("cblas_sgemm", b.sgemm);
  lib->resolve("cblas_dgemm", b.dgemm);
  lib->resolve("openblas_set_num_threads", b.set_num_threads);
  lib->resolve("openblas_get_corename", b.corename);
  b.set_num_threads(compute_threads());
  g_opened = true;
  return b;  // the library stays open for the process's life
}

}  // namespace

const OpenBlas& openblas() {
  static const OpenBlas b = open_openblas();
  return b;
}

bool openblas_opened() { return g_opened; }

}  // namespace loom
