// `loom train` when [parallel] ps_servers > 0: the parameter-server roles of a job (see
// ps_train.cc and docs/parallelism.md, "Parameter servers").
#pragma once

#include "commands.h"
#include "config.h"
#include "config_train.h"
#include "loom/comm/rendezvous.h"

namespace loom::app {

// Runs this rank's role: a server (rank < ps_servers) or a worker. `t` of the config
// resolved for the job's world; `restarted`: a later generation of an elastic job (it resumes).
int run_ps_train(const TrainConfig& t, const TrainArgs& a, const comm::LaunchEnv& env, bool restarted);

// `loom train CFG --ps-join HOST:PORT`: one more worker for the running async or ssp job
// whose store is at HOST:PORT. `c` is the config as given (resolved here for the job's
// world, read from the store).
int run_ps_join(Config c, const TrainArgs& a);

}  // namespace loom::app
