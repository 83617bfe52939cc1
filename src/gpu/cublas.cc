// cuBLAS opened on first use (cublas.h).
#include "gpu/cublas.h"

#include <optional>
#include <string>
#include <utility>

#include "core/dl_library.h"

namespace loom::gpu {
namespace {

// `base` (libcublas or libcublasLt) by the soname it was compiled against, then the toolkit's copy.
DlLibrary open_library(const char* what, const char* base) {
  const std::string soname = cat(base, ".so.", CUBLAS_VER_MAJOR);
  const std::string toolkit = cat(LOOM_CUDA_LIBRARY_DIR, "/", soname);
  std::string reason;
  std::optional<DlLibrary> lib = DlLibrary::open(what, {soname, toolkit}, &reason);
  if (!lib)
    throw RuntimeError(cat("cannot open ", what, " as ", soname, " or ", toolkit, ": ", reason,
                           " (LD_LIBRARY_PATH may need the CUDA toolkit's lib directory; docs/gpu.md)"));
  return std::move(*lib);
}

Cublas open_cublas() {
  const DlLibrary lib = open_library("cuBLAS", "libcublas");
  Cublas c;
  lib.resolve("cublasCreate_v2", c.create);
  lib.resolve("cublasDestroy_v2", c.destroy);
  lib.resolve("cublasSetStream_v2", c.set_stream);
  lib.resolve("cublasSetWorkspace_v2", c.set_workspace);
  lib.resolve("cublasGemmEx", c.gemm_ex);
  return c;
}

CublasLt open_cublas_lt() {
  const DlLibrary lib = open_library("cuBLASLt", "libcublasLt");
  CublasLt c;
  lib.resolve("cublasLtCreate", c.create);
  lib.resolve("cublasLtDestroy", c.destroy);
  lib.resolve("cublasLtMatmulDescCreate", c.desc_create);
  lib.resolve("cublasLtMatmulDescDestroy", c.desc_destroy);
  lib.resolve("cublasLtMatmulDescSetAttribute", c.desc_set);
  lib.resolve("cublasLtMatrixLayoutCreate", c.layout_create);
  lib.resolve("cublasLtMatrixLayoutDestroy", c.layout_destroy);
  lib.resolve("cublasLtMatmulPreferenceCreate", c.pref_create);
  lib.resolve("cublasLtMatmulPreferenceDestroy", c.pref_destroy);
  lib.resolve("cublasLtMatmulPreferenceSetAttribute", c.pref_set);
  lib.resolve("cublasLtMatmulAlgoGetHeuristic", c.heuristic);
  lib.resolve("cublasLtMatmul", c.matmul);
  return c;
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = open_cublas();
  return c;
}

const CublasLt& cublas_lt() {
  static const CublasLt c = open_cublas_lt();
  return c;
}

}  // namespace loom::gpu
