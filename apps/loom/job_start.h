// The start of `loom train` on one rank: the launch environment (an elastic generation's
// usable ranks), the config resolved for them and the memory plan checked (docs/launch.md,
// "Elastic jobs").
#pragma once

#include <optional>
#include <string>

#include "commands.h"
#include "config.h"
#include "config_train.h"
#include "loom/train/train.h"

namespace loom::app {

// The job as this rank starts it (train::RunStart), with the command's config, resolved,
// and the memory plan checked on each host's first rank before anything is loaded.
struct JobStart : train::RunStart {
  Config c;                   // the command's: what the files and flags said, resolved
  std::optional<int> exit;    // set: nothing more to do (a dry run, an idle elastic rank)
};

JobStart start_job(const TrainArgs& a);

}  // namespace loom::app
