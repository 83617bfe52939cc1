// The bytes a training run will need, computed from the config before anything large is
// allocated (docs/parallelism.md, "Memory"): per rank of the layout (each pipeline stage's
// share of parameters, gradients and optimizer state after ZeRO, one micro-batch's
// activations times the micro-batches the schedule keeps in flight, the recompute
// workspace, evaluation, checkpoint shares, exact-sum buffers and the token files), summed over the
// ranks this host runs, against the memory this host has free. `loom train` refuses a run
// that cannot fit; `loom train --dry-run` and `loom plan --config` print the same figures.
#pragma once

#include <string>
#include <vector>

#include "config.h"

namespace loom::app {

struct RankBytes {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, evaluation = 0, checkpoint = 0,
         exact_sums = 0, data = 0;
  double total() const;
};

struct MemoryPlan {
  std::vector<RankBytes> stages;  // per pipeline stage, replicas alike (rank 0's is stages[0])
  std::vector<int> host_ranks;    // the job ranks this host runs
  double host_bytes = 0;          // their sum
  double available_bytes = 0;     // what this host has free now (MemAvailable, cgroup limit)
  std::string data_files;         // what the data figure reads, for messages
};

// The ranks the layout of an unresolved config names (parallel.dp x tp x pp), for planning
// a launch from outside one; `fallback` when dp is 0 (as many as launched) or out of range.
int layout_ranks(const Config& unresolved, int fallback);
// REQUIRES: c resolved for `world` ranks; `host_ranks` the job ranks on this host.
MemoryPlan plan_memory(const Config& c, int world, const std::vector<int>& host_ranks);
// Lines for people: each stage's figures in GiB and the host's total against what is free.
std::string describe(const MemoryPlan& plan);
// InputError "needs X GiB on this host (...), Y GiB available" when the plan does not fit.
void check_fits(const MemoryPlan& plan);

}  // namespace loom::app
