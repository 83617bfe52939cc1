#include "loom/parallel/checkpointing.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/log.h"

namespace loom::parallel {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// `ranges` (ascending, disjoint) less `remove` (ascending, disjoint).
std::vector<std::pair<int64_t, int64_t>> subtract(const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                                  const std::vector<std::pair<int64_t, int64_t>>& remove) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto [lo, hi] : ranges) {
    for (const auto& [rlo, rhi] : remove) {
      if (rhi <= lo || rlo >= hi) continue;
      if (rlo > lo) out.emplace_back(lo, rlo);
      lo = std::max(lo, rhi);
    }
    if (hi > lo) out.emplace_back(lo, hi);
  }
  return out;
}

// Throws on every rank when any rank's `error` is not empty, naming the first such rank.
void check_all(comm::Communicator& world, const std::string& error, const std::string& what) {
  const std::vector<std::string> errors = all_gather_strings(world, error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) throw RuntimeError(cat(what, " failed on rank ", r, ": ", errors[r]));
}

}  // namespace

int64_t RankShare::bytes() const {
  int64_t n = 0;
  for (const auto* list : {&model, &optimizer})
    for (const checkpoint::Piece& p : *list) n += static_cast<int64_t>(p.nbytes());
  return n;
}

size_t share_bytes(const Mesh& mesh, const ParamSet& params, const DataParallel& dp, const OptimizerStep& update) {
  int64_t elements = 0;
  for (const auto& [lo, hi] : subtract(dp.owned_ranges(), copied_ranges(mesh, params))) elements += hi - lo;
  return static_cast<size_t>(elements) * dtype_size(params.dtype()) * (1 + update.owned_state().buffers.size());
}

RankShare rank_share(const Mesh& mesh, const ParamSet& params, const DataParallel& dp, const OptimizerStep& update,
                     checkpoint::PieceArena* arena) {
  const std::vector<std::pair<int64_t, int64_t>> owned = dp.owned_ranges();
  const std::vector<std::pair<int64_t, int64_t>> mine = subtract(owned, copied_ranges(mesh, params));
  const optim::RangeState state = update.owned_state();
  if (arena != nullptr) arena->reserve(share_bytes(mesh, params, dp, update));
  auto pieces = [&](const std::vector<checkpoint::FlatRun>& runs, const std::string& prefix) {
    return arena != nullptr ? checkpoint::pieces(params, runs, prefix, arena) : checkpoint::pieces_in_place(params, runs, prefix);
  };
  RankShare share;
  // The values and the optimizer state: one view per owned range (the values from this
  // rank's masters: ZeRO 3 never gathers the model to save); each of `mine` lies in one.
  auto runs_of = [&](const std::vector<Tensor>& views) {
    std::vector<checkpoint::FlatRun> runs;
    size_t k = 0;
    for (const auto& [lo, hi] : mine) {
      while (owned[k].second <= lo) ++k;
      const auto* b = static_cast<const char*>(views[k].raw());
      LOOM_CHECK(views[k].dtype() == params.dtype());
      runs.push_back({lo, hi, b + (lo - owned[k].first) * static_cast<int64_t>(dtype_size(views[k].dtype()))});
    }
    return runs;
  };
  share.model = pieces(runs_of(dp.owned_values()), "");
  share.optimizer_steps = state.steps;
  for (const auto& [role, views] : state.buffers)
    for (checkpoint::Piece& p : pieces(runs_of(views), role + "."))
      share.optimizer.push_back(std::move(p));
  return share;
}

std::string save_checkpoint(comm::Communicator& world, const RankShare& share, const std::string& root, int64_t step,
                            const json& state, const json& layout, const checkpoint::SaveOptions& options) {
  const bool lead = world.rank() == 0;
  const std::string what = cat("checkpoint step_", step);
  // What fn threw, as text for the other ranks ("" when nothing): every rank must reach
  // the next exchange, so nothing may escape on one of them alone.
  auto attempt = [](auto fn) -> std::string {
    try {
      fn();
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  // A stale temporary directory goes before anyone writes into it.
  check_all(world, lead ? attempt([&] { checkpoint::begin_save(root, step); }) : "", what);
  const std::string tmp = checkpoint::temp_dir(root, step);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "%05d.safetensors", world.rank());
  json records = json::array();
  const std::string written = attempt([&] {
    records.push_back(checkpoint::write_shard(tmp, std::string("model-") + suffix, share.model, checkpoint::Part::kModel, step));
    records.push_back(
        checkpoint::write_shard(tmp, std::string("optimizer-") + suffix, share.optimizer, checkpoint::Part::kOptimizer, step));
  });
  const std::vector<std::string> all = all_gather_strings(world, written.empty() ? records.dump() : "!" + written);
  std::string failed;
  for (size_t r = 0; r < all.size() && failed.empty(); ++r)
    if (all[r].starts_with("!")) failed = cat(what, " failed on rank ", r, ": ", all[r].substr(1));
  std::string committed;
  if (failed.empty() && lead) {
    committed = attempt([&] {
      std::vector<json> every;
      for (const std::string& r : all)
        for (const json& rec : json::parse(r)) every.push_back(rec);
      checkpoint::commit(root, step, every, state, layout, share.optimizer_steps, options);
    });
  }
  if (lead && (!failed.empty() || !committed.empty())) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // what did get written; the previous checkpoint is untouched
  }
  if (!failed.empty()) throw RuntimeError(failed);
  check_all(world, committed, what);
  return (fs::path(root) / cat("step_", step)).string();
}

CheckpointSaver::CheckpointSaver(comm::Communicator& world, bool async) : world_(world) {
  if (async) own_ = world.split(0, world.rank());
}

void CheckpointSaver::prepare(size_t bytes) { arena_.reserve(bytes, /*touch=*/true); }

CheckpointSaver::~CheckpointSaver() {
  if (writer_.joinable()) writer_.join();
}

namespace {
// save_checkpoint, logging (rank 0) what this rank wrote and how fast.
std::string timed_save(comm::Communicator& comm, const RankShare& share, const SaveRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string dir = save_checkpoint(comm, share, r.root, r.step, r.state, r.layout, r.options);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info(cat("checkpoint step_", r.step, ": this rank wrote ", static_cast<double>(share.bytes()) / (1 << 20),
               " MiB of tensors in ", s * 1e3, " ms (", static_cast<double>(share.bytes()) / s / 1e9,
               " GB/s), the whole checkpoint committed"));
  return dir;
}
}  // namespace

std::string CheckpointSaver::save(const std::function<RankShare(checkpoint::PieceArena*)>& share_of, SaveRequest r) {
  if (!own_) return timed_save(world_, share_of(nullptr), r);
  if (writer_.joinable() && !done_ && world_.rank() == 0)
    log_info(cat("checkpoint step_", r.step, ": waiting for step_", writing_step_, ", still being written"));
  saved_ = wait();  // its directory goes to the next poll()
  RankShare share = share_of(&arena_);
  done_ = false;
  writing_step_ = r.step;
  writer_ = std::thread([this, share = std::move(share), r = std::move(r)] {
    try {
      dir_ = timed_save(*own_, share, r);
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_ = true;
  });
  return "";
}

std::optional<std::string> CheckpointSaver::poll() {
  if (saved_) return std::exchange(saved_, std::nullopt);
  if (!writer_.joinable() || !done_) return std::nullopt;
  return wait();
}

std::optional<std::string> CheckpointSaver::wait() {
  if (!writer_.joinable()) return std::exchange(saved_, std::nullopt);
  writer_.join();
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  return dir_;
}

void set_aside_uncommitted_steps(const std::string& root) {
  for (const auto& [from, to] : checkpoint::set_aside_uncommitted(root))
    log_warn(cat(printable(from), " is newer than the step `latest` names: a save renamed into place but never committed "
                 "(a crash), or `latest` moved back by hand; set aside as ", printable(to),
                 " (not read, pruned or overwritten), and the run resumes from `latest`"));
}

checkpoint::Checkpoint open_for_resume(const std::string& root, const json& model, uint64_t seed, int64_t steps,
                                     int64_t global_batch) {
  if (!checkpoint::latest_step_dir(root))
    throw InputError(cat(root, ": --resume given but there is no checkpoint; --restart starts the run afresh "
                         "(the old directory is kept aside)"));
  checkpoint::Checkpoint ck = checkpoint::Checkpoint::open(root);
  const checkpoint::State& saved = ck.state();
  const std::string state_path = (fs::path(ck.path()) / "state.json").string();
  if (saved.model != model)
    throw InputError(cat(state_path, ": checkpoint of model ", saved.model.is_null() ? "(not recorded)" : saved.model.dump(),
                         ", the config builds ", model.dump()));
  // All randomness is counter-based on (seed, stream, epoch); a different seed would
  // silently change the data order, so it is refused. So is a step past the run's end, or
  // a data cursor that another global batch would move.
  if (!saved.seed) throw InputError(cat(state_path, ": rng.seed: missing; expected the seed the run trained with"));
  if (*saved.seed != seed)
    throw InputError(cat(ck.path(), ": trained with job.seed = ", *saved.seed, ", the config says ", seed,
                         "; resume with the same seed"));
  if (saved.step > steps)
    throw InputError(cat(state_path, ": step = ", saved.step, " is past training.steps = ", steps));
  if (saved.data_cursor && *saved.data_cursor != saved.step * global_batch)
    throw InputError(cat(state_path, ": data_cursor = ", *saved.data_cursor, " at step ", saved.step,
                         ", but training.global_batch = ", global_batch, " puts it at ", saved.step * global_batch,
                         "; resume with the global batch the run trained with"));
  return ck;
}

}  // namespace loom::parallel
