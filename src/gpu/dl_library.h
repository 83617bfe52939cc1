// CUDA's libraries opened on first use (cublas.h says why): the soname a loom was compiled
// against, then a fallback path, and each entry point resolved by name.
#pragma once

#include <dlfcn.h>

#include <string>

#include "loom/core/error.h"

namespace loom::gpu {

class DlLibrary {
 public:
  // Opens `soname`, else `fallback`; RuntimeError naming both, dlerror's reason and
  // `hint` when neither opens. The library stays open for the process's life.
  DlLibrary(const std::string& what, const std::string& soname, const std::string& fallback, const char* hint)
      : what_(what) {
    lib_ = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) lib_ = dlopen(fallback.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr)
      throw RuntimeError(cat("cannot open ", what, " as ", soname, " or ", fallback, ": ", dlerror(), " (", hint, ")"));
  }
  // fn = the entry point `name`; RuntimeError when the library has none.
  template <typename F>
  void resolve(const char* name, F& fn) const {
    fn = reinterpret_cast<F>(dlsym(lib_, name));
    if (fn == nullptr) throw RuntimeError(cat(what_, " has no ", name, " (", dlerror(), ")"));
  }

 private:
  std::string what_;
  void* lib_ = nullptr;
};

}  // namespace loom::gpu
