// loom launch: spawns local ranks with the torchrun-style environment, hosts the
// rendezvous store (node 0), prefixes output lines with the rank, forwards SIGINT and
// SIGTERM, and tears the job down when any rank fails (docs/launch.md).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "loom/launch/launch.h"
#include "loom/core/error.h"
#include "loom/comm/rendezvous.h"
#include "loom/launch/rank_group.h"

namespace loom::launch {

std::pair<std::string, int> parse_master(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InputError(cat("--master '", s, "' is not HOST:PORT"));
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535) throw InputError(cat("--master '", s, "': port must be 0..65535"));
  return {s.substr(0, colon), port};
}

std::pair<int, int> parse_nproc(const std::string& s) {
  auto number = [&](const std::string& part) {
    size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(part, &used);
    } catch (...) {
      used = 0;
    }
    if (used != part.size() || part.empty() || n < 1 || n > (1 << 20))
      throw InputError(cat("loom launch: -n '", s, "': expected N or MIN:MAX, counts of ranks from 1 to 2^20"));
    return n;
  };
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return {number(s), number(s)};
  const int lo = number(s.substr(0, colon)), hi = number(s.substr(colon + 1));
  if (lo > hi) throw InputError(cat("loom launch: -n ", s, ": MIN is above MAX"));
  return {lo, hi};
}

int run_launch(const LaunchArgs& a) {
  if (a.command.empty()) throw InputError("loom launch: no command given after --");
  if (!(a.grace_s > 0 && a.grace_s < 1e6)) throw InputError(cat("loom launch: --grace ", a.grace_s, ": expected seconds in (0, 1e6)"));
  if (a.join || a.max_restarts >= 0 || a.nproc.find(':') != std::string::npos) return run_elastic_launch(a);
  if (a.local != 0) throw InputError("loom launch: --local is for elastic jobs (-n MIN:MAX, --max-restarts or --join)");
  const int nproc = parse_nproc(a.nproc).first;
  if (a.nnodes < 1 || a.nnodes > (1 << 20)) throw InputError(cat("loom launch: --nnodes ", a.nnodes, ": expected 1 to 2^20 nodes"));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw InputError(cat("loom launch: --node-rank ", a.node_rank, " is out of range for --nnodes ", a.nnodes));
  auto [host, port] = parse_master(a.master);
  if (a.nnodes > 1 && port == 0)
    throw InputError("loom launch: --nnodes > 1 needs --master HOST:PORT with a fixed port");

  // The per-job secret: given (multi-node jobs must share one), or generated here.
  std::string secret = a.secret;
  if (secret.empty()) {
    if (a.nnodes > 1)
      throw InputError("loom launch: --nnodes > 1 needs the same LOOM_SECRET_FILE (mode 600) on every node");
    secret = comm::generate_secret();
  }
  std::string job_id = !a.job_id.empty() ? a.job_id
                       : a.nnodes > 1 ? comm::tagged_job_id(cat("job-", host, "-", port), secret)
                                      : cat("job-", comm::generate_secret().substr(0, 16));
  const SecretFile secret_file = make_secret_file(secret);

  std::unique_ptr<comm::TcpStoreServer> server;
  if (a.node_rank == 0) {
    server = std::make_unique<comm::TcpStoreServer>(
        comm::TcpStoreConfig{.host = host, .port = port, .secret = secret, .job_id = job_id});
    port = server->port();
  }

  RankGroup group({.command = a.command, .first_rank = a.node_rank * nproc, .count = nproc,
                   .world = a.nnodes * nproc, .group_rank = a.node_rank, .store_host = host, .store_port = port,
                   .job_id = job_id, .secret = secret_file, .allow_expendable = true, .bind = a.bind == "cores"});
  while (!group.done())
    for (int sig : group.pump(50))
      if (sig == SIGINT || sig == SIGTERM)
        group.forward(sig, std::chrono::milliseconds(static_cast<int64_t>(a.grace_s * 1000)));
  if (const auto& f = group.failure()) {
    std::fprintf(stderr, "loom launch: %s; stopped the other ranks\n", f->describe().c_str());
    return f->code;
  }
  for (int code : group.exit_codes())
    if (code != 0) return code;
  return 0;
}

}  // namespace loom::launch
