#include "loom/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "loom/core/error.h"

namespace loom {
namespace {
std::mutex g_mu;
std::atomic<bool> g_quiet{false};

void emit(const char* level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "loom: %s%s\n", level, printable(message).c_str());
  std::fflush(stderr);
}
}  // namespace

void log_info(const std::string& message) {
  if (!g_quiet.load()) emit("", message);
}
void log_warn(const std::string& message) { emit("warning: ", message); }
void set_log_quiet(bool quiet) { g_quiet.store(quiet); }

}  // namespace loom
