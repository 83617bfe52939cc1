// Sharded checkpoints from `loom train` (docs/formats.md, "Checkpoint directories"): every
// rank writes the part of the model and optimizer state it owns, in parallel, and rank 0
// commits the directory once every shard is on disk.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "loom/checkpoint.h"
#include "loom/comm.h"
#include "loom/data_parallel.h"
#include "stages.h"

namespace loom::app {

// What one rank writes: its share of its replica's parameters and optimizer state (its
// part of every unit, less what another rank of the replica also holds), as blocks of the
// logical tensors. REQUIRES: parameters materialized (dp.materialize_params()).
struct RankShare {
  std::vector<checkpoint::Piece> model, optimizer;
  int64_t optimizer_steps = 0;
};
RankShare rank_share(const Mesh& mesh, const ParamSet& params, const parallel::DataParallel& dp);

// Writes checkpoint root/step_<step> from every rank's share. Collective over `world`;
// rank 0 writes the index and the state ({state} plus format, version, step and the
// optimizer's step count) and replaces `latest`. Returns the step directory. A failure on
// any rank (a full disk, an I/O error) is a RuntimeError on every rank naming the rank and
// the file; the previous checkpoint and `latest` are untouched.
std::string save_checkpoint(comm::Communicator& world, const RankShare& share, const std::string& root, int64_t step,
                            const nlohmann::json& state, const nlohmann::json& layout,
                            const checkpoint::SaveOptions& options);

}  // namespace loom::app
