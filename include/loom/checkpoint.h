// Checkpoints (docs/formats.md). One immutable directory per step:
//   step_N/model.safetensors      weights, Hugging Face names, loadable by any safetensors reader
//   step_N/optimizer.safetensors  optimizer state, "<role>.<param name>" (e.g. exp_avg.transformer.wte.weight)
//   step_N/state.json             step, data cursor, RNG state, optimizer step count, model shape, config
//   step_N/index.json             every logical tensor (name, dtype, shape, its shards) and
//                                 every file's size and SHA-256
// written under a temporary name, fsynced, renamed, and only then named by the `latest`
// file beside it. Loading verifies every file's SHA-256 before any weight is used.
// A bare .safetensors file (e.g. Hugging Face GPT-2 weights) loads as weights only.
// Thread-safety: functions are reentrant; do not write one directory from two threads.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loom/optim.h"
#include "loom/params.h"
#include "loom/safetensors.h"

namespace loom::checkpoint {

constexpr int kFormatVersion = 1;

struct SaveOptions {
  // Keep the newest `keep` step directories (0 keeps all), and whatever `keep` says the
  // newest one whose loss and weights were finite.
  int keep = 0;
  bool loss_finite = true;  // the loss of the step saved; state.json "finite" also checks the weights
};

// Writes root/step_<step> atomically and points root/latest at it. Returns its path.
std::string save(const std::string& root, int64_t step, const ParamSet& params,
                 const optim::Optimizer* optimizer, const nlohmann::json& state,
                 const SaveOptions& options = {});

// The same from optimizer state already in the flat layout (e.g. gathered from ZeRO shards).
std::string save(const std::string& root, int64_t step, const ParamSet& params,
                 const optim::FlatState& optimizer, const nlohmann::json& state,
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

class Checkpoint {
 public:
  // `path`: a step directory, a checkpoint root holding `latest`, a run directory holding
  // checkpoints/, or a .safetensors file.
  // Verifies every file's size and hash (directories), parses the headers and validates
  // index.json and state.json field by field, and that the index and the files agree on
  // every tensor. InputError naming the file and the field on anything wrong.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  bool has_state() const { return state_.has_value(); }
  const State& state() const { return *state_; }  // REQUIRES: has_state()
  const SafetensorsFile& weights() const { return *model_; }

  // "" when every weight and optimizer value is finite; else one line naming the first
  // tensor holding NaN or Inf, how many it holds, and how many other tensors do.
  std::string nonfinite_report() const;

  // Copies every parameter of `params` from the checkpoint, by name, converting dtype.
  // InputError naming the tensor when one is missing or its shape differs.
  void load_params(const ParamSet& params) const;
  // Restores optimizer state buffers and step count. REQUIRES: has_state().
  void load_optimizer(const ParamSet& params, optim::Optimizer& optimizer) const;
  // Fills `state`'s buffers (named and sized by the caller, flat layout) and step count.
  void load_optimizer(const ParamSet& params, optim::FlatState& state) const;

 private:
  std::string path_;
  std::optional<SafetensorsFile> model_, optimizer_;
  std::optional<State> state_;
};

// Resolves root/latest (or a step directory) to the step directory; nullopt when none.
std::optional<std::string> latest_step_dir(const std::string& root);

}  // namespace loom::checkpoint
