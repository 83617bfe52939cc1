// A shared library opened on first use (dlopen) rather than linked, for those that would
// cost every loom process its start-up time and memory (libcurl, cuBLAS, NCCL: each user
// says what it measured). The library stays open for the process's life.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <optional>
#include <string>

#include "loom/core/error.h"

namespace loom {

class DlLibrary {
 public:
  // The first of `names` that opens (RTLD_NOW | RTLD_LOCAL); nullopt when none does, with
  // dlerror's reason for the last in *reason, for the caller's own message.
  static std::optional<DlLibrary> open(const std::string& what, std::initializer_list<std::string> names,
                                       std::string* reason) {
    for (const std::string& name : names) {
      if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return DlLibrary(what, lib);
      const char* e = dlerror();
      *reason = e != nullptr ? e : "";
    }
    return std::nullopt;
  }
  // fn = the entry point `name`; RuntimeError "WHAT has no NAME (reason)" when there is none.
  template <typename F>
  void resolve(const char* name, F& fn) const {
    fn = reinterpret_cast<F>(dlsym(lib_, name));
    if (fn == nullptr) throw RuntimeError(cat(what_, " has no ", name, " (", dlerror(), ")"));
  }

 private:
  DlLibrary(std::string what, void* lib) : what_(std::move(what)), lib_(lib) {}
  std::string what_;
  void* lib_;
};

}  // namespace loom
