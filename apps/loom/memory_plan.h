// The command line's side of the memory plan (loom/parallel/memory_plan.h): its input from the typed
// training config.
#pragma once

#include <vector>

#include "config_train.h"
#include "loom/parallel/memory_plan.h"

namespace loom::app {

using parallel::check_fits;
using parallel::describe;
using parallel::MemoryPlan;

// REQUIRES: t of a config resolved for `world` ranks; `host_ranks` the job ranks on this host.
MemoryPlan plan_memory(const TrainConfig& t, int world, const std::vector<int>& host_ranks);

}  // namespace loom::app
