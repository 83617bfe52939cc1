// Checkpoints (docs/formats.md). One immutable directory per step:
//   step_N/model-<rank>.safetensors      the weights each rank wrote: blocks of logical tensors
//   step_N/optimizer-<rank>.safetensors  its optimizer state, "<role>.<param name>" (e.g. exp_avg.transformer.wte.weight)
//   step_N/state.json                    step, data cursor, RNG state, optimizer step count, model shape, config
//   step_N/index.json                    every logical tensor (Hugging Face name, dtype, global shape)
//                                        with the blocks its shards hold, and every file's size and SHA-256
//   step_N/index.sha256                  index.json's own SHA-256
// Every rank writes its own shards into a temporary directory (write_shard); the lead then
// writes the index and the state, fsyncs, renames, and only then points the `latest` file
// beside it at the new directory (commit). Loading verifies the SHA-256 of every file it
// reads before any weight is used, and puts the blocks together for any layout: each rank
// reads what its own pieces need. Version 1 directories (one model.safetensors and one
// optimizer.safetensors) and bare .safetensors files (e.g. Hugging Face GPT-2 weights) load too.
// Thread-safety: functions are reentrant; a Checkpoint is used from one thread (it reads
// its files on first use); do not write one directory from two threads.
#pragma once

#include <nlohmann/json.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "loom/optim/optim.h"
#include "loom/core/params.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/checkpoint/tensor_pieces.h"

namespace loom::checkpoint {

constexpr int kFormatVersion = 2;

enum class Part : uint8_t { kModel, kOptimizer };

struct SaveOptions {
  // Keep the newest `keep` step directories up to the one `latest` names (0 keeps all), and
  // whatever `keep` says the newest one whose loss and weights were finite. The step
  // `latest` names and any newer one are never removed (docs/formats.md, "Pruning").
  int keep = 0;
  bool loss_finite = true;  // the loss of the step saved; state.json "finite" also checks the weights
  // Files kept in the step directory beside the shards, by name (one of kExtraFiles), each
  // listed in the index with its size and SHA-256: the run's tokenizer.
  std::map<std::string, std::string> files;
};

// The names a step directory may hold besides state.json and the shards.
inline constexpr const char* kExtraFiles[] = {"tokenizer/encoder.json", "tokenizer/vocab.bpe"};

// ---- Writing: every rank write_shard()s into temp_dir(), then the lead commit()s. ----

// Fault injection for tests (docs/formats.md, "Crash safety"): called at each point of a
// save with the point's name and the step: "shard" (a shard file complete in the temporary
// directory), "state" and "index" (written there), "renamed" (the directory is step_N) and
// "latest" (replaced). Empty: none. Set before any save starts (it is read unlocked).
using FaultHook = std::function<void(std::string_view point, int64_t step)>;
void set_fault_hook(FaultHook hook);

// Where step `step` is written before commit renames it: root/.step_N.tmp.
std::string temp_dir(const std::string& root, int64_t step);
// The lead, before any rank writes: removes what a save of this step that never finished
// left behind, and creates temp_dir(root, step).
void begin_save(const std::string& root, int64_t step);
// Writes `pieces` (of one part) as dir/file (safetensors, fsynced) and returns its record for
// commit: {"file", "bytes", "sha256", "finite", "tensors": [{name, part, dtype, shape, key,
// offsets, extents, sha256}]}. An empty list writes nothing and returns {"tensors": []}.
// RuntimeError naming the file when it cannot be written (e.g. the disk is full).
nlohmann::json write_shard(const std::string& dir, const std::string& file, const std::vector<Piece>& pieces, Part part,
                           int64_t step);
// The lead, once every rank's records are in temp_dir: index.json (with `layout`), its hash
// index.sha256, and state.json (from `state`, with format, version, step, optimizer_steps when `optimizer_steps`
// is set, and finite), then the directory is fsynced, renamed to root/step_N (a step_N
// already there is set aside, as set_aside_uncommitted does), the root fsynced, `latest`
// replaced, and old steps pruned. Returns the step directory.
std::string commit(const std::string& root, int64_t step, const std::vector<nlohmann::json>& records,
                   const nlohmann::json& state, const nlohmann::json& layout, std::optional<int64_t> optimizer_steps,
                   const SaveOptions& options = {});

// Before a resume, the lead: every step directory newer than the one `latest` names (a
// save renamed into place but never committed, or `latest` moved back by hand) is renamed
// to step_N.set-aside-<UTC time>, never read, pruned or overwritten. Returns each (from,
// to); none without a readable `latest` naming a step directory that exists. Call it once
// that step has loaded: a resume refused for it then changes nothing.
std::vector<std::pair<std::string, std::string>> set_aside_uncommitted(const std::string& root);

// One process holding the whole model: all of the above, as rank 0 of one.
std::string save(const std::string& root, int64_t step, const ParamSet& params,
                 const optim::Optimizer* optimizer, const nlohmann::json& state,
                 const SaveOptions& options = {});

// state.json as Checkpoint::open validated it (docs/formats.md): every field of its type and
// in its range, so callers read them without checks of their own.
struct State {
  int64_t step = 0;
  int64_t optimizer_steps = 0;  // <= step
  bool has_optimizer_steps = false;
  std::optional<int64_t> data_cursor;
  std::optional<uint64_t> seed;  // rng.seed
  // {"kind": "gpt" | "mlp", and that kind's shape fields, each an integer in [1, 2^31 - 1]};
  // null when the checkpoint does not say.
  nlohmann::json model;
  bool finite = true;
  nlohmann::json raw;  // the whole file
};

// A logical tensor of a checkpoint: its name, part, dtype and global shape.
struct TensorInfo {
  std::string name;
  Part part;
  DType dtype;
  Shape shape;
};

class Checkpoint {
 public:
  // `path`: a step directory, a checkpoint root holding `latest`, a run directory holding
  // checkpoints/, or a .safetensors file.
  // Validates index.json and state.json field by field, every file's size against the
  // index, that each tensor's shards tile it, and state.json's hash. Shard files are read
  // (their size and hash verified, their headers checked against the index) when a load
  // first needs them. InputError naming the file and the field on anything wrong.
  static Checkpoint open(const std::string& path);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::string& path() const { return path_; }
  bool has_state() const { return state_.has_value(); }
  const State& state() const { return *state_; }  // REQUIRES: has_state()
  int format_version() const;    // 0 for a bare .safetensors file
  const nlohmann::json& layout() const;  // what wrote it (version 2), else null
  std::vector<TensorInfo> tensors() const;
  // The tensor named `name` (a Hugging Face file may omit the "transformer." prefix); null when absent.
  std::optional<TensorInfo> find(const std::string& name) const;
  // Files and bytes: {file name: bytes}, as the index lists them (a bare file: itself).
  std::map<std::string, int64_t> files() const;
  // One of kExtraFiles, read and verified against the index; nullopt when the checkpoint
  // has none of that name. InputError on a size or hash that differs.
  std::optional<std::string> extra_file(const std::string& name) const;
  // Every kExtraFiles file it holds, read and verified: what a checkpoint made from this one
  // (pruned, quantized) keeps (SaveOptions::files).
  std::map<std::string, std::string> extra_files() const;

  // "" when every weight and optimizer value read so far is finite; else one line naming
  // the first tensor holding NaN or Inf, how many it holds, and how many other tensors do.
  std::string nonfinite_report() const;

  // Fills every parameter of `params` (this process's piece of each) from the checkpoint,
  // by name, converting dtype. InputError naming the tensor when one is missing or its
  // logical shape differs. Reads and verifies every file it needs before copying anything.
  void load_params(const ParamSet& params) const;
  // Restores optimizer state buffers and step count. REQUIRES: has_state().
  void load_optimizer(const ParamSet& params, optim::Optimizer& optimizer) const;
  // Fills `state`'s buffers (named and sized by the caller) over its ranges, and its step
  // count: reads and verifies only the files whose shards meet those ranges (a ZeRO rank's
  // part). REQUIRES: has_state().
  void load_optimizer(const ParamSet& params, optim::RangeState& state) const;
  // The whole logical tensor, converted to dtype (f32 or f64).
  Tensor read(const std::string& name, DType dtype) const;
  // Reads and verifies every file (`loom ckpt verify`). Returns the bytes read.
  int64_t verify_all() const;
  // The bytes of the shard files read so far.
  int64_t bytes_read() const;

 private:
  Checkpoint();
  struct Impl;
  std::string path_;
  std::optional<State> state_;
  std::unique_ptr<Impl> impl_;
};

// Resolves root/latest (or a step directory) to the step directory; nullopt when none.
std::optional<std::string> latest_step_dir(const std::string& root);

}  // namespace loom::checkpoint
