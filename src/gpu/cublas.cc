// cuBLAS opened on first use (cublas.h).
#include "gpu/cublas.h"

#include <dlfcn.h>

#include <string>

#include "loom/core/error.h"

namespace loom::gpu {
namespace {

template <typename F>
void resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) throw RuntimeError(cat("cuBLAS has no ", name, " (", dlerror(), ")"));
}

Cublas open_cublas() {
  const std::string soname = cat("libcublas.so.", CUBLAS_VER_MAJOR);
  const std::string toolkit = cat(LOOM_CUDA_LIBRARY_DIR, "/", soname);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen(toolkit.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    throw RuntimeError(cat("cannot open cuBLAS as ", soname, " or ", toolkit, ": ", dlerror(),
                           " (LD_LIBRARY_PATH may need the CUDA toolkit's lib directory; docs/gpu.md)"));
  Cublas c;
  resolve(lib, "cublasCreate_v2", c.create);
  resolve(lib, "cublasDestroy_v2", c.destroy);
  resolve(lib, "cublasSetStream_v2", c.set_stream);
  resolve(lib, "cublasGemmEx", c.gemm_ex);
  return c;  // the library stays open for the process's life
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = open_cublas();
  return c;
}

}  // namespace loom::gpu
