// The resolved run configuration: built-in defaults < TOML file < --section.key=value
// overrides (DESIGN.md section 4). Only apps/ parses files and flags (STYLE.md rule 5).
// Every key has a declared type; unknown keys, wrong types and out-of-range values are
// InputErrors naming the file or flag and the key.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/optim/optim.h"

namespace loom::app {

using Value = std::variant<int64_t, double, bool, std::string>;

class Config {
 public:
  // A key as the user gave it, for errors: "key (from FILE)", "key (default)".
  using Where = std::function<std::string(const std::string&)>;
  // Defaults only.
  Config();
  // Merges a TOML file. InputError for a missing file, bad TOML, unknown key, wrong type.
  void merge_file(const std::string& path);
  // The same from TOML text already read from `path` (named in errors).
  void merge_toml(std::string_view text, const std::string& path);
  // Applies "--section.key=value" strings (the leading dashes optional).
  void apply_overrides(const std::vector<std::string>& overrides);
  // Fills model shape keys from [model] preset where not set explicitly and parallel.dp = 0
  // ("all ranks") from `world` (the ranks the launcher started), then validates ranges and
  // relations. InputError naming the key.
  void resolve(int world = 1);

  int64_t i(const std::string& key) const;
  double f(const std::string& key) const;
  bool b(const std::string& key) const;
  const std::string& s(const std::string& key) const;
  bool explicitly_set(const std::string& key) const { return set_.count(key) != 0; }
  void set(const std::string& key, const Value& v);

  // TOML text of every key, grouped by section.
  std::string to_toml() const;
  std::string run_path() const;  // run_dir / name
  // job.threads, or when it is 0 an equal share of the machine's cores for each of the
  // `local_ranks` ranks on this host (two thread pools spinning on one core cost 2.4x).
  int threads(int local_ranks = 1) const;

 private:
  // What a pipeline layout needs of the model and the batch (dp x tp x pp = world is
  // checked before: the batch checks divide by dp).
  void check_layout(const std::function<std::string(const std::string&)>& where) const;
  void check_param_servers(const std::function<std::string(const std::string&)>& where) const;
  // resolve()'s other checks (config_checks.cc), in the order it makes them.
  void check_ranges(const std::string& kind, const Where& where) const;
  void check_world(int world, int64_t servers, const Where& where) const;
  void check_values(const Where& where) const;
  void check_modes(const std::string& kind, const Where& where) const;
  void check_cuda(const std::string& kind, const Where& where) const;
  void check_rest(const std::string& kind, const Where& where) const;

  std::map<std::string, Value> values_;
  std::map<std::string, std::string> set_;  // key -> where it was set (file or flag)
};

// Sizes the compute thread pool (Config::threads) and picks who computes matrix products
// (job.gemm, job.gemm_path) for this process. InputError when the CPU lacks the path asked for.
void apply_compute_settings(const Config& c, int local_ranks = 1);

// Which kind of model a preset names: "gpt" or "mlp".
std::string model_kind(const Config& c);

// [training] precision's format: "fp32" kF32, "bf16" kBF16, "fp16" kF16 (Config::resolve has
// checked the name).
DType precision_format(const std::string& name);

}  // namespace loom::app
