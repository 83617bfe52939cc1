// cuBLAS opened on first use (cublas.h).
#include "gpu/cublas.h"

#include <optional>
#include <string>

#include "core/dl_library.h"

namespace loom::gpu {
namespace {

Cublas open_cublas() {
  const std::string soname = cat("libcublas.so.", CUBLAS_VER_MAJOR);
  const std::string toolkit = cat(LOOM_CUDA_LIBRARY_DIR, "/", soname);
  std::string reason;
  const std::optional<DlLibrary> lib = DlLibrary::open("cuBLAS", {soname, toolkit}, &reason);
  if (!lib)
    throw RuntimeError(cat("cannot open cuBLAS as ", soname, " or ", toolkit, ": ", reason,
                           " (LD_LIBRARY_PATH may need the CUDA toolkit's lib directory; docs/gpu.md)"));
  Cublas c;
  lib->resolve("cublasCreate_v2", c.create);
  lib->resolve("cublasDestroy_v2", c.destroy);
  lib->resolve("cublasSetStream_v2", c.set_stream);
  lib->resolve("cublasGemmEx", c.gemm_ex);
  return c;
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = open_cublas();
  return c;
}

}  // namespace loom::gpu
