// `loom train` when [parallel] ps_servers > 0: the parameter-server roles of a job (see
// ps_train.cc and docs/parallelism.md, "Parameter servers").
#pragma once

#include "commands.h"
#include "config.h"
#include "loom/rendezvous.h"

namespace loom::app {

// Runs this rank's role: a server (rank < ps_servers) or a worker. `c` resolved for the
// job's world; `restarted`: a later generation of an elastic job (it resumes).
int run_ps_train(const Config& c, const TrainArgs& a, const comm::LaunchEnv& env, bool restarted);

}  // namespace loom::app
