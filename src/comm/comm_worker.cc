// A rank for the multi-process failure tests: joins the world from the launcher's
// environment (like any Loom command) and runs one scripted behaviour. On a CommError it
// prints one line "ERROR <kind> <unix_ms> <message>" and exits 3.
//   comm_worker [OPTIONS] loop BYTES [all_gather]  all_reduce (or all_gather) BYTES of f32 until something fails
//   comm_worker [OPTIONS] mismatch     rank 0 calls all_reduce, every other rank broadcast
//   comm_worker [OPTIONS] skip         rank 1 skips the second of three all_reduces
// OPTIONS, each as [comm] sets it (a later one wins): --timeout-ms N, --transport NAME.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/op.h"
#include "loom/comm/rendezvous.h"

using namespace loom::comm;

int main(int argc, char** argv) {
  CommConfig cfg;
  int first = 1;  // the mode's index, after the options
  for (; first + 1 < argc && std::strncmp(argv[first], "--", 2) == 0; first += 2) {
    if (std::strcmp(argv[first], "--timeout-ms") == 0) {
      cfg.timeout = milliseconds(std::atoi(argv[first + 1]));
    } else if (std::strcmp(argv[first], "--transport") == 0) {
      cfg.transport = argv[first + 1];
    } else {
      std::fprintf(stderr, "comm_worker: unknown option %s (expected --timeout-ms N or --transport NAME)\n",
                   argv[first]);
      return 2;
    }
  }
  argc -= first - 1;
  argv += first - 1;
  std::string mode = argc > 1 ? argv[1] : "loop";
  try {
    LaunchEnv env = launch_env_from_environment();
    std::unique_ptr<TcpStoreServer> server;
    std::unique_ptr<Store> store;
    auto comm = join_world(env, cfg, server, store);
    Communicator& c = *comm;
    std::printf("READY %d\n", c.rank());
    std::fflush(stdout);
    if (mode == "loop") {
      size_t bytes = argc > 2 ? std::stoul(argv[2]) : 1 << 20;
      const bool gather = argc > 3 && std::string(argv[3]) == "all_gather";  // bytes: the output
      std::vector<float> x(bytes / 4, 1.0f);
      const size_t part = x.size() / c.size();
      for (;;) {
        if (gather)
          all_gather(c, {.input = x.data() + c.rank() * part, .output = x.data(), .count = part});
        else
          all_reduce(c, {.output = x.data(), .count = x.size(), .op = ReduceOp::kMax});
      }
    } else if (mode == "mismatch") {
      float x[4] = {};
      if (c.rank() == 0)
        all_reduce(c, {.output = x, .count = 4});
      else
        broadcast(c, {.buffer = x, .count = 4, .root = 0});
    } else if (mode == "skip") {
      float x[4] = {};
      for (int i = 0; i < 3; ++i)
        if (!(c.rank() == 1 && i == 1)) all_reduce(c, {.output = x, .count = 4});
      barrier(c);
    }
    std::printf("DONE %d\n", c.rank());
    return 0;
  } catch (const CommError& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch()).count();
    const char* kind[] = {"CommError", "PeerLostError", "TimeoutError", "MismatchError", "AuthError"};
    std::printf("ERROR %s %lld %s\n", kind[static_cast<int>(error_kind_of(e))], static_cast<long long>(ms), e.what());
    std::fflush(stdout);
    return 3;
  } catch (const loom::Error& e) {
    std::printf("ERROR %s 0 %s\n", "Error", e.what());
    return e.exit_code();
  }
}
