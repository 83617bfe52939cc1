// The start of `loom train` on one rank: the launch environment (an elastic generation's
// usable ranks), the config resolved for them and the memory plan checked, and the signals a
// run answers (docs/launch.md, "Preemption", "Elastic jobs").
#pragma once

#include <optional>
#include <string>

#include "commands.h"
#include "config.h"
#include "config_train.h"
#include "loom/launch/launch.h"
#include "loom/comm/comm.h"
#include "loom/comm/rendezvous.h"

namespace loom::app {

// The job as this rank starts it: the launch environment (an elastic generation's usable
// ranks), the config resolved for them, and the memory plan checked on each host's first
// rank before anything is loaded.
struct JobStart {
  comm::LaunchEnv env;
  Config c;         // the command's: what the files and flags said, resolved
  TrainConfig tc;   // the same typed, for everything below the command
  std::optional<launch::ElasticGeneration> elastic;  // under an elastic launcher: this generation
  bool restarted = false;                    // a later generation of an elastic job
  std::string memory_plan_line;  // logged once the input has been found good
  std::optional<int> exit;       // set: nothing more to do (a dry run, an idle elastic rank)
  // --ps-join: the running job's store, and its world size (0: not joining).
  std::unique_ptr<comm::Store> join_store;
  int ps_join_world = 0;
};

JobStart start_job(const TrainArgs& a);

// Refuses (InputError naming both ranks and layouts) ranks started with different layouts
// or model shapes (TrainConfig::layout). Collective over world.
void check_same_layout(comm::Communicator& world, const std::string& layout);

// SIGTERM (what Kubernetes and Slurm send before killing): the run finishes its step, saves
// and exits 0. SIGUSR1 from an elastic launcher (start_job installs it): ranks wait to join,
// so the run stops after its next checkpoint with kExitForResize and the launcher restarts
// it on more ranks.
void install_terminate_handler();
bool terminate_requested();
bool resize_requested();

}  // namespace loom::app
