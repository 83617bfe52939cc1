// The trainer: one rank's run of a job on real data, writing the run directory (DESIGN.md
// section 4: config.toml, metrics.jsonl, checkpoints/step_N, logs/). The step itself is
// parallel::Parallelized's (loom/parallel/parallelize.h); the run builds the model, claims
// the run directory, loads weights, joins the job, lays the model out, then keeps the books
// of every step: metrics, evaluation, checkpoints, signals, traces (docs/architecture.md
// walks a step). `loom train` (apps/loom) resolves a config into a RunStart and calls run().
// Thread-safety: one run per process, on the thread that calls run().
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "loom/comm/comm.h"
#include "loom/comm/rendezvous.h"
#include "loom/launch/launch.h"
#include "loom/train/train_config.h"

namespace loom::train {

// How a run starts (`loom train`'s flags of the same names).
struct RunOptions {
  bool resume = false;
  bool restart = false;  // an existing run directory is moved aside and the run starts afresh
  bool resume_if_saved = false;  // resume when the run has a checkpoint, else start (a scheduler's restart)
  bool quiet = false;  // no progress; the run summary still prints
  bool allow_nonfinite = false;  // resume from a checkpoint holding NaN or Inf
  std::string ps_join;  // HOST:PORT: join the running parameter-server job whose store is there, as a new worker
  std::string init_from;  // start from these weights (a checkpoint or .safetensors): step 0, fresh optimizer
};

// The job as this rank starts it: the launch environment (an elastic generation's usable
// ranks), the typed config resolved for them, and what the start found.
struct RunStart {
  // This process's place in the job: comm::launch_env_from_environment() under a launcher
  // (loom launch, mpirun, Slurm, torchrun's variables); as declared, one process alone.
  comm::LaunchEnv env;
  TrainConfig tc;
  std::optional<launch::ElasticGeneration> elastic;  // under an elastic launcher: this generation
  bool restarted = false;                            // a later generation of an elastic job
  std::string memory_plan_line;                      // logged once the input has been found good
  // --ps-join: the running job's store, and its world size (0: not joining).
  std::unique_ptr<comm::Store> join_store;
  int ps_join_world = 0;
};

// Builds, loads, joins and lays out, then steps until training.steps, a SIGTERM or a resize;
// a parameter server's rank serves instead. Returns the process exit code. InputError for
// bad input (naming the file, key or rank), found before anything is written.
int run(const RunOptions& options, RunStart& start);

// Refuses (InputError naming both ranks and layouts) ranks started with different layouts
// or model shapes (TrainConfig::layout). Collective over world.
void check_same_layout(comm::Communicator& world, const std::string& layout);

// SIGTERM (what Kubernetes and Slurm send before killing): the run finishes its step, saves
// and exits 0 (run() installs the handler). SIGUSR1 from an elastic launcher (installed by
// whoever starts the job, at once: the launcher may ask while the rank is still starting):
// ranks wait to join, so the run stops after its next checkpoint with kExitForResize and the
// launcher restarts it on more ranks.
void install_terminate_handler();
bool terminate_requested();
void install_resize_handler();
bool resize_requested();

}  // namespace loom::train
