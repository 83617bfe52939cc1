#include "loom/host.h"

#include <algorithm>
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

}  // namespace

double available_memory_bytes() { return std::min(meminfo_available(), cgroup_room()); }

}  // namespace loom
