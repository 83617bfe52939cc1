// What `loom launch` and its elastic form share, and what an elastic launcher tells the
// ranks it starts (docs/launch.md, "Elastic jobs").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "commands.h"

namespace loom::app {

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
// Read from the environment; nullopt outside an elastic job. InputError when malformed.
std::optional<ElasticGeneration> elastic_generation_from_environment();

}  // namespace loom::app
