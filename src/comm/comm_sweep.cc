// The collective sweep as real processes: every rank runs this binary, joins the world
// from its environment (loom launch, torchrun, mpirun or Slurm variables) and runs the
// same closed-form checks as the thread suite, plus the 16M-element case. Any rank's
// failure fails its exit code, which the launcher reports.
//   LOOM_TEST_TRANSPORT   [comm] transport (default auto)
//   LOOM_TEST_ALGORITHM   algorithm for every op (default auto)
//   LOOM_BIND_ADDRESS     where this rank listens (default: chosen by join_world)
#include <gtest/gtest.h>

#include "comm/comm_checks.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

TEST(Sweep, EveryCollectiveMatchesClosedForm) {
  CommConfig cfg;
  cfg.transport = env_or("LOOM_TEST_TRANSPORT", "auto");
  cfg.timeout = milliseconds(60000);
  cfg.shm_slot_bytes = 64 << 10;
  if (auto bind = env_or("LOOM_BIND_ADDRESS", ""); !bind.empty()) cfg.bind_address = bind;
  Algorithm a = algorithm_from_name(env_or("LOOM_TEST_ALGORITHM", "auto"));
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<Store> store;
  auto comm = join_world(launch_env_from_environment(), cfg, server, store);
  std::printf("rank %d of %d: links", comm->rank(), comm->size());
  for (int p = 0; p < comm->size(); ++p) std::printf(" %s", comm->link_kind(p).c_str());
  std::printf("\n");
  testing::sweep(*comm, a);
  testing::large_16m(*comm, a);
  barrier(*comm);
}

}  // namespace
}  // namespace loom::comm
