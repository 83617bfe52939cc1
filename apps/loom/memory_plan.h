// The command line's side of the memory plan (loom/memory_plan.h): its input from a resolved
// config, and the ranks an unresolved config's layout names.
#pragma once

#include <vector>

#include "config.h"
#include "loom/memory_plan.h"

namespace loom::app {

using parallel::check_fits;
using parallel::describe;
using parallel::MemoryPlan;

// The ranks the layout of an unresolved config names (parallel.dp x tp x pp), for planning
// a launch from outside one; `fallback` when dp is 0 (as many as launched) or out of range.
int layout_ranks(const Config& unresolved, int fallback);
// REQUIRES: c resolved for `world` ranks; `host_ranks` the job ranks on this host.
MemoryPlan plan_memory(const Config& c, int world, const std::vector<int>& host_ranks);

}  // namespace loom::app
