// What `loom launch` and its elastic form share, and what an elastic launcher tells the
// ranks it starts (docs/launch.md, "Elastic jobs").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::launch {

// `loom launch` (docs/launch.md): its flags.
struct LaunchArgs {
  std::string nproc = "1";  // N ranks on this node; or MIN:MAX, an elastic job's world size
  int nnodes = 1, node_rank = 0;
  std::string master = "127.0.0.1:0";
  double grace_s = 30;  // after SIGTERM or SIGINT is forwarded, before SIGKILL
  // Elastic jobs (docs/launch.md, "Elastic jobs"): -n MIN:MAX or --max-restarts start one;
  // --join adds this launcher's ranks to the one coordinated at --master.
  int max_restarts = -1;  // -1: not given (0 in an elastic job)
  int local = 0;          // ranks this launcher runs; 0: MAX (1 with --join)
  bool join = false;
  std::string bind = "none";  // "cores": each local rank on its share of the launcher's cores
  std::vector<std::string> command;
  // From the launcher's own environment, which the command line reads: the job's secret
  // (LOOM_SECRET_FILE; empty: generated, single-node jobs only) and LOOM_JOB_ID (empty: derived).
  std::string secret, job_id;
};
// Runs this node's ranks of the job (an elastic job: run_elastic_launch). Returns the
// launcher's exit code.
int run_launch(const LaunchArgs& a);

// "HOST:PORT" (port 0..65535); InputError naming --master otherwise.
std::pair<std::string, int> parse_master(const std::string& s);

// -n: "N" gives {N, N}; "MIN:MAX" gives both (1 <= MIN <= MAX). InputError otherwise.
std::pair<int, int> parse_nproc(const std::string& s);

// An elastic job's launcher: coordinates (hosting the store at --master) or, with --join,
// adds its ranks to the job coordinated there.
int run_elastic_launch(const LaunchArgs& a);

// Exit code of a rank that saved a checkpoint and stopped so that the job can grow
// (EX_TEMPFAIL): the elastic launcher restarts the job with more ranks.
constexpr int kExitForResize = 75;

// An elastic launcher's word to a rank it starts (environment variables LOOM_ELASTIC_*):
// the job's generation (0 first, one more for every restart or resize), why the previous
// generation ended and when (Unix ms).
struct ElasticGeneration {
  int64_t generation = 0;
  std::string reason;
  int64_t since_unix_ms = 0;
};
// Milliseconds since the Unix epoch (the clock LOOM_ELASTIC_SINCE_MS is on).
int64_t unix_ms();

}  // namespace loom::launch
