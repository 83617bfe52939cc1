#include "loom/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom {

long sys_check(long rc, const char* call, const std::string& subject) {
  if (rc < 0) {
    int err = errno;
    throw RuntimeError(cat(call, "(", subject, ") failed: ", std::strerror(err)));
  }
  return rc;
}

void check_failed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "loom: internal error at %s:%d: %s failed\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace loom
