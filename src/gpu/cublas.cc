// cuBLAS opened on first use (cublas.h).
#include "gpu/cublas.h"

#include <string>

#include "gpu/dl_library.h"

namespace loom::gpu {
namespace {

Cublas open_cublas() {
  const std::string soname = cat("libcublas.so.", CUBLAS_VER_MAJOR);
  const DlLibrary lib("cuBLAS", soname, cat(LOOM_CUDA_LIBRARY_DIR, "/", soname),
                      "LD_LIBRARY_PATH may need the CUDA toolkit's lib directory; docs/gpu.md");
  Cublas c;
  lib.resolve("cublasCreate_v2", c.create);
  lib.resolve("cublasDestroy_v2", c.destroy);
  lib.resolve("cublasSetStream_v2", c.set_stream);
  lib.resolve("cublasGemmEx", c.gemm_ex);
  return c;
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = open_cublas();
  return c;
}

}  // namespace loom::gpu
