#include "loom/core/host.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

namespace loom {
namespace {

// "MemAvailable:  123456 kB" -> bytes; infinity when the kernel does not say.
double meminfo_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("MemAvailable:")) return std::strtod(line.c_str() + 13, nullptr) * 1024;
  return std::numeric_limits<double>::infinity();
}

// The cgroup (v2) limit less what the group uses; infinity without a limit.
double cgroup_room() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.starts_with("0::")) path = line.substr(3);
  auto read_number = [](const std::string& file) {
    std::ifstream in(file);
    std::string v;
    in >> v;
    return v.empty() || v == "max" ? -1.0 : std::strtod(v.c_str(), nullptr);
  };
  const std::string dir = "/sys/fs/cgroup" + path;
  const double max = read_number(dir + "/memory.max"), used = read_number(dir + "/memory.current");
  if (max < 0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, max - std::max(0.0, used));
}

// Set by set_memory_budget; 0: measure.
std::atomic<double> memory_budget{0};

}  // namespace

double available_memory_bytes() {
  if (const double budget = memory_budget.load(std::memory_order_relaxed); budget > 0) return budget;
  return std::min(meminfo_available(), cgroup_room());
}

void set_memory_budget(double bytes) { memory_budget.store(bytes, std::memory_order_relaxed); }

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

namespace {
// VmHWM of /proc/self/status in MiB; 0 when it cannot be read.
double vm_hwm_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("VmHWM:")) return std::strtod(line.c_str() + 6, nullptr) / 1024;
  return 0;
}
std::atomic<double> g_peak_before_phase{0};  // the high-water mark when the last phase began
}  // namespace

double peak_resident_mb() { return std::max(g_peak_before_phase.load(), vm_hwm_mb()); }

void begin_memory_phase() {
  g_peak_before_phase = peak_resident_mb();
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the resident size (Linux 4.0+)
}

double phase_peak_resident_mb() { return vm_hwm_mb(); }

}  // namespace loom
