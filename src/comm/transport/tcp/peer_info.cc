// What a rank publishes in the store so that its peers can connect (tcp_mesh.h): its
// address, pid and host identity.
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "comm/transport/tcp/tcp_mesh.h"
#include "loom/core/error.h"

namespace loom::comm {

std::string this_host_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  // Two network namespaces on one kernel are two hosts as far as links go.
  char ns[128] = {};
  [[maybe_unused]] auto n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  return cat(host, "/", boot, "/", ns);
}

std::string encode_peer_info(const PeerInfo& p) {
  return cat(p.host, " ", p.port, " ", p.pid, " ", p.host_id);
}

PeerInfo parse_peer_info(const std::string& s, const std::string& key) {
  PeerInfo p;
  std::istringstream in(s);
  in >> p.host >> p.port >> p.pid;
  std::getline(in >> std::ws, p.host_id);
  if (!in && !in.eof()) throw CommError(cat("store key '", key, "' holds a malformed address '", s, "'"), -1);
  if (p.host.empty() || p.port <= 0 || p.host_id.empty())
    throw CommError(cat("store key '", key, "' holds a malformed address '", s, "'"), -1);
  return p;
}

}  // namespace loom::comm
