// `loom train`'s configuration typed (loom/train/train_config.h): built once from a resolved
// Config by train_config(), and all that goes below the command functions; nothing under
// apps/loom reads a config key but config*.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "loom/parallel/memory_plan.h"
#include "loom/parallel/mesh.h"
#include "loom/nn/gpt_config.h"
#include "loom/optim/optim.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/schedule.h"
#include "loom/train/train_config.h"

namespace loom::app {

using train::TrainConfig;

// The shard cache's directory when data.cache_dir (or --cache-dir) is empty:
// $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom/shards, else ~/.cache/loom/shards.
std::string default_cache_dir();

// REQUIRES: c resolved; local_ranks: the job's ranks on this host (the compute threads'
// share). InputError for what only a typed value shows (debug.overflow_at without fp16).
TrainConfig train_config(const Config& c, int local_ranks = 1);

// The optimizer and learning-rate schedule [training] asks for (REQUIRES: c resolved).
optim::OptimizerConfig optimizer_config(const Config& c);
optim::ScheduleConfig schedule_config(const Config& c);
// A GPT's shape from [model].
nn::GptConfig gpt_config(const Config& c);

// The ranks the layout of an unresolved config names (parallel.dp x tp x pp, and the
// parameter servers), for planning a launch from outside one; `fallback` when dp is 0 (as
// many as launched) or out of range.
int layout_ranks(const Config& unresolved, int fallback);
// The largest world size up to `available` that `c` resolves for; `available` itself when
// none does (resolving then names what is wrong).
int usable_world(const Config& c, int available);

// The memory plan (loom/parallel/memory_plan.h) of a typed config.
using parallel::check_fits;
using parallel::describe;
using parallel::MemoryPlan;

// REQUIRES: t of a config resolved for `world` ranks; `host_ranks` the job ranks on this host.
MemoryPlan plan_memory(const TrainConfig& t, int world, const std::vector<int>& host_ranks);

}  // namespace loom::app
