// A dp x pp x tp layout of ranks (docs/parallelism.md, docs/architecture.md): this rank's
// place in it, its communicators, and the collectives that join the stages and pieces of a
// replica (the pipeline step's end, the bubble).
// Thread-safety: a Mesh is used by the training thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/parallel/data_parallel.h"
#include "loom/nn/gpt.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/tensor_parallel.h"

namespace loom::parallel {

// The shape of a dp x pp x tp layout (pp stages of v chunks each).
struct MeshShape {
  int dp = 1, pp = 1, v = 1, tp = 1;
};

// This rank's place in the layout and its communicators. Ranks: pp outermost, then dp, tp
// innermost: rank = (stage x dp + dp_index) x tp + tp_index.
struct Mesh {
  // `rank`'s coordinates in `shape` (no communicators yet: split_mesh).
  static Mesh at(const MeshShape& shape, int rank);

  int dp_size = 1, pp = 1, v = 1, tp = 1;
  int dp_index = 0, stage = 0, tp_index = 0;
  std::unique_ptr<comm::Communicator> dp;    // this stage's and piece's replicas; null when pp = tp = 1 (the world is)
  std::unique_ptr<comm::Communicator> pipe;  // this replica's stages, rank = stage
  std::unique_ptr<comm::Communicator> tied;  // first and last stage (the tied embedding)
  std::unique_ptr<comm::Communicator> tpc;   // this stage's tensor-parallel pieces, rank = tp_index (tp > 1)
  std::unique_ptr<comm::Communicator> mp;    // this replica's stages and pieces, rank = stage x tp + tp_index (both > 1)
  // Tensor parallelism's seam over tpc (tp > 1): made by at(), so that the model can be
  // built with it before the job joins; split_mesh attaches it.
  std::unique_ptr<TensorParallelSeam> seam;

  // This rank's tensor-parallel piece (nn::Shard{} when tp = 1), with sequence parallelism
  // or not.
  nn::Shard shard(bool sequence_parallel) const;

  bool split() const { return pp > 1 || tp > 1; }
  bool first() const { return stage == 0; }
  // The job rank of each stage of this replica's pipeline.
  std::vector<int> stage_ranks() const {
    std::vector<int> r;
    for (int s = 0; s < pp; ++s) r.push_back((s * dp_size + dp_index) * tp + tp_index);
    return r;
  }
  bool last() const { return stage == pp - 1; }
  // "stage 1 of 2, tp 0 of 2, replica 3" for what this layout has.
  std::string where() const;
};

// Every rank's string, in rank order, on every rank. Collective over world.
std::vector<std::string> all_gather_strings(comm::Communicator& world, const std::string& mine);
// Splits `world` into the mesh's communicators. Collective over world (pp or tp > 1 only).
void split_mesh(comm::Communicator& world, Mesh& mesh);
// The flat ranges of this rank's parameters that another rank of its replica also holds and
// counts: the last stage's copy of the tied embedding (the first stage's counts), and a
// tensor-parallel piece's replicated parameters (piece 0's count). Ascending, merged.
std::vector<std::pair<int64_t, int64_t>> copied_ranges(const Mesh& mesh, const ParamSet& params);
// The tied embedding's place in this stage's flat buffers, and which gradients other ranks
// count in the norm, for DataParallel.
StageGroups stage_groups(const Mesh& mesh, const ParamSet& params);

// One optimizer step's pipeline part: runs the schedule, gives every stage the last stage's
// micro-batch losses (returned), sums the tied embedding's gradients and starts the sums
// over replicas (DataParallel's last micro-step). Collective over the mesh.
std::vector<double> pipeline_step(const Mesh& mesh, Pipeline& pipe, DataParallel& dp,
                                  const Pipeline::Batch& batch, int64_t b, int64_t t, double scale);

// The step's bubble as measured, 1 - compute / (stages x the slowest stage's step); as the
// simulator predicts it on the same list from the stages' measured mean costs (`predicted`);
// and as the simulator gives it replaying each action's own measured times, deriving only
// the waits (`replayed`). Collective over mesh.pipe.
struct PipelineBubble {
  double measured = -1, predicted = -1, replayed = -1;
};
PipelineBubble pipeline_bubble(const Mesh& mesh, const Pipeline& pipe);

// What of the GPT (n_layer blocks) this rank holds.
nn::GptPart mesh_part(int64_t n_layer, const Mesh& mesh);

}  // namespace loom::parallel
