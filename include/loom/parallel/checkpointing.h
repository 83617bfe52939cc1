// Sharded checkpoints of a parallel training job (docs/formats.md, "Checkpoint
// directories"): every rank writes the part of the model and optimizer state it owns, in
// parallel, and rank 0 commits the directory once every shard is on disk. In parallel/, not
// checkpoint/: what a rank owns is its mesh's and DataParallel's to say (docs/architecture.md).
#pragma once

#include <nlohmann/json.hpp>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "loom/checkpoint/checkpoint.h"
#include "loom/comm/comm.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/optimizer_step.h"
#include "loom/parallel/mesh.h"

namespace loom::parallel {

// What one rank writes: its share of its replica's parameters and optimizer state (its
// part of every unit, less what another rank of the replica also holds), as blocks of the
// logical tensors, copied into `arena`, or (arena null) made in place, copied only as they
// are written (a save the training waits for: no copy of the share in memory). The values
// come from this rank's own masters (under ZeRO 3 its shard: nothing is gathered to save).
struct RankShare {
  std::vector<checkpoint::Piece> model, optimizer;
  int64_t optimizer_steps = 0;
  int64_t bytes() const;  // of every piece's data
};
// `update`: the optimizer over what `dp` says this rank updates.
RankShare rank_share(const Mesh& mesh, const ParamSet& params, const DataParallel& dp, const OptimizerStep& update,
                     checkpoint::PieceArena* arena);
// The bytes of that share.
size_t share_bytes(const Mesh& mesh, const ParamSet& params, const DataParallel& dp, const OptimizerStep& update);

// Writes checkpoint root/step_<step> from every rank's share. Collective over `world`;
// rank 0 writes the index and the state ({state} plus format, version, step and the
// optimizer's step count) and replaces `latest`. Returns the step directory. A failure on
// any rank (a full disk, an I/O error) is a RuntimeError on every rank naming the rank and
// the file; the previous checkpoint and `latest` are untouched.
std::string save_checkpoint(comm::Communicator& world, const RankShare& share, const std::string& root, int64_t step,
                            const nlohmann::json& state, const nlohmann::json& layout,
                            const checkpoint::SaveOptions& options);

// Where and what save_checkpoint writes, less the share.
struct SaveRequest {
  std::string root;
  int64_t step = 0;
  nlohmann::json state, layout;
  checkpoint::SaveOptions options;
};

// Saves checkpoints on the training thread, or (`async`) on a thread of its own with its own
// communicator (a split of `world`), so that training goes on while the shards are
// written: the training thread only copies its share. One save at a time: a save requested
// while the last is still being written waits for it (logged), never interleaves.
// Thread-safety: used from the training thread.
class CheckpointSaver {
 public:
  // Collective over world when async (the split).
  CheckpointSaver(comm::Communicator& world, bool async);
  ~CheckpointSaver();  // waits for the save in flight, dropping its error (the run is failing)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Allocates and touches the arena for shares of `bytes` now, before training: the first
  // save then stalls no longer than the others (async saves).
  void prepare(size_t bytes);
  // Collective over world. Waits for the save in flight, takes this rank's share from
  // `share_of`, then sync: writes the checkpoint from the share made in place (share_of
  // given null: nothing is copied, the training waits) and returns its directory; async:
  // takes the share copied into the saver's arena (reused from save to save), hands it to
  // the writer and returns "".
  std::string save(const std::function<RankShare(checkpoint::PieceArena*)>& share_of, SaveRequest request);
  // The directory of the async save that has completed since the last call, without
  // waiting; nullopt when none. Throws the save's RuntimeError when it failed.
  std::optional<std::string> poll();
  // Waits for the async save in flight, if any; the directory of the save completed since
  // the last poll() or wait() (or nullopt), or its error.
  std::optional<std::string> wait();

 private:
  comm::Communicator& world_;
  checkpoint::PieceArena arena_;
  std::unique_ptr<comm::Communicator> own_;  // async: the writer's communicator
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::string dir_;              // set by the writer before done_
  std::optional<std::string> saved_;  // a save that save() waited for, not yet reported
  std::exception_ptr failure_;  // likewise
  int64_t writing_step_ = -1;
};

// The lead, before a resume: every step directory newer than the one `latest` names is set
// aside (checkpoint::set_aside_uncommitted) and each is logged as a warning.
void set_aside_uncommitted_steps(const std::string& root);

// Opens the latest checkpoint under `root` for a resume and checks that it belongs to this
// run: the model the config builds, the seed, a step within training.steps, and the data
// cursor the global batch puts there. InputError naming the file otherwise.
checkpoint::Checkpoint open_for_resume(const std::string& root, const nlohmann::json& model, uint64_t seed, int64_t steps,
                                       int64_t global_batch);

}  // namespace loom::parallel
