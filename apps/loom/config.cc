#include "config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <toml++/toml.h>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/optim/loss_scale.h"
#include "loom/nn/gpt.h"
#include "loom/parallel/schedule.h"
#include "loom/obs/trace.h"
#include "loom/train/train_config.h"

namespace loom::app {
namespace {

// A config names a few dozen keys; a file far larger is not one (and is not read whole).
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

// The schema: every key, its type (by its default's type) and its default. Key names are
// stable (DESIGN.md section 4): add keys, never rename.
const std::vector<std::pair<std::string, Value>>& schema() {
  static const std::vector<std::pair<std::string, Value>> kSchema = {
      {"job.name", std::string("run")},
      {"job.run_dir", std::string("runs")},
      {"job.seed", int64_t{1337}},
      {"job.threads", int64_t{0}},  // 0: all cores of the machine
      {"job.log_every", int64_t{10}},
      {"job.mem_limit_mb", 0.0},  // per rank: a step ending above it stops the job; 0: none
      {"job.gemm", std::string("loom")},       // who computes matrix products
      {"job.gemm_path", std::string("auto")},  // Loom's GEMM micro-kernel: auto = CPUID
      {"job.device", std::string("cpu")},      // or "cuda": the step on a GPU (docs/gpu.md)
      {"model.preset", std::string("gpt-mini")},
      {"model.n_layer", int64_t{4}},
      {"model.n_head", int64_t{4}},
      {"model.d_model", int64_t{256}},
      {"model.seq_len", int64_t{256}},
      {"model.vocab_size", int64_t{256}},
      {"model.hidden", int64_t{512}},
      {"data.train", std::string("")},
      {"data.val", std::string("")},
      {"data.tokenizer", std::string("bytes")},  // what made the token files: kept with the run and its checkpoints
      {"data.verify", std::string("hash")},      // a manifest's shards: "hash" (SHA-256 at start, rank 0) or "size"
      {"data.windows", std::string("tokens")},   // where windows start: "tokens" (every seq_len) or "documents"
      {"data.prefetch", int64_t{4}},             // micro-batches made ahead by a reader thread; 0: none
      {"data.cache_dir", std::string("")},       // remote shards' cache; "": $LOOM_CACHE_DIR or ~/.cache/loom/shards
      {"data.cache_mb", 10240.0},                // its size bound (least recently used shards go first)
      {"data.fetch_retries", int64_t{5}},        // a remote shard's attempts after a failed one (0.5 s, 1 s, 2 s, ...)
      {"training.steps", int64_t{100}},
      {"training.global_batch", int64_t{8}},
      {"training.micro_batch", int64_t{8}},
      {"training.lr", 3e-4},
      {"training.min_lr", 3e-5},
      {"training.warmup_steps", int64_t{10}},
      {"training.decay", std::string("cosine")},
      {"training.weight_decay", 0.1},
      {"training.grad_clip", 1.0},
      {"training.optimizer", std::string("adamw")},
      {"training.beta1", 0.9},
      {"training.beta2", 0.95},
      {"training.eps", 1e-8},
      {"training.momentum", 0.9},
      {"training.decay_embeddings", false},
      {"training.decay_norms_and_biases", false},
      {"training.eval_every", int64_t{0}},
      {"training.eval_steps", int64_t{10}},
      {"training.recompute", std::string("none")},
      {"training.precision", std::string("fp32")},  // activations and products: fp32, bf16 or fp16
      {"training.loss_scale", 65536.0},             // fp16: the first loss scale, a power of two
      {"training.loss_scale_window", int64_t{1000}},  // fp16: clean steps before the scale doubles
      {"training.keep_zeros", false},  // weights zero at the start (a pruned checkpoint) stay zero
      {"training.teacher", std::string("")},  // distillation: the teacher's checkpoint
      {"training.distill_alpha", 0.5},
      {"training.distill_temperature", 1.0},
      {"parallel.dp", int64_t{0}},
      {"parallel.tp", int64_t{1}},
      {"parallel.pp", int64_t{1}},
      {"parallel.zero", int64_t{0}},
      {"parallel.pp_schedule", std::string("1f1b")},
      {"parallel.microbatches", int64_t{0}},
      {"parallel.virtual_stages", int64_t{1}},
      {"parallel.bucket_mb", 25.0},
      {"parallel.deterministic", false},
      {"parallel.sequence_parallel", false},
      {"parallel.ps_servers", int64_t{0}},  // parameter servers: the first S ranks; 0: none
      {"parallel.ps_mode", std::string("sync")},
      {"parallel.ps_staleness", int64_t{0}},  // ssp: K
      {"parallel.ps_hierarchical", std::string("auto")},  // sync: a host's workers sum first, one pushes
      {"comm.transport", std::string("auto")},
      {"comm.timeout_s", 300.0},
      {"comm.grad_dtype", std::string("f32")},
      {"comm.param_dtype", std::string("f32")},
      {"checkpoint.every", int64_t{0}},
      {"checkpoint.keep", int64_t{3}},
      {"checkpoint.dir", std::string("")},
      {"checkpoint.async", false},
      {"checkpoint.every_s", 0.0},
      {"checkpoint.grace_s", 20.0},
      {"checkpoint.sigterm_exit_code", int64_t{0}},  // exit status after SIGTERM stopped the run with a checkpoint
      {"profile.trace_steps", std::string("")},
      {"metrics.port", int64_t{0}},              // Prometheus /metrics while training (rank 0); 0: none
      {"metrics.host", std::string("127.0.0.1")},  // where it listens; another address needs LOOM_API_KEY
      {"metrics.every_rank", false},             // every rank serves, on metrics.port + its local rank
      {"metrics.peak_gflops", 0.0},              // one rank's peak: loom_train_mfu against it (0: not exported)
      // Failures and slowness on demand, for tests and benchmarks (include/loom/train/debug_hooks.h).
      {"debug.fault_at", std::string("")},
      {"debug.delay_ms", std::string("")},
      {"debug.overflow_at", std::string("")},
      {"debug.jitter_ms", int64_t{0}},
  };
  return kSchema;
}

const char* type_name(const Value& v) {
  switch (v.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a boolean";
    default: return "a string";
  }
}

struct Preset {
  const char* name;
  const char* kind;
  int64_t n_layer, n_head, d_model, seq_len, vocab_size;
};
constexpr Preset kPresets[] = {
    {"gpt-nano", "gpt", 2, 2, 64, 64, 256},
    {"gpt-mini", "gpt", 4, 4, 256, 256, 256},
    {"gpt2-124m", "gpt", 12, 12, 768, 1024, 50257},
    {"gpt", "gpt", 4, 4, 256, 256, 256},
    {"mlp", "mlp", 2, 1, 0, 0, 10},
};

const Preset* find_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

}  // namespace

Config::Config() {
  for (const auto& [k, v] : schema()) values_[k] = v;
}

void Config::set(const std::string& key, const Value& v) {
  values_.at(key) = v;
  set_[key] = "code";
}

void Config::merge_file(const std::string& path) {
  std::error_code ec;
  const auto kind = std::filesystem::status(path, ec).type();
  if (kind == std::filesystem::file_type::not_found) throw InputError(cat(path, ": config file not found"));
  if (kind != std::filesystem::file_type::regular)
    throw InputError(cat(path, ": not a regular file; expected a TOML config file"));
  merge_toml(read_file(path, kMaxConfigBytes), path);
}

void Config::merge_toml(std::string_view text, const std::string& path) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(cat(path, ":", e.source().begin.line, ": invalid TOML: ", e.description()));
  }
  for (auto&& [section, node] : tbl) {
    const std::string sec(section.str());
    const toml::table* t = node.as_table();
    if (t == nullptr) throw InputError(cat(path, ": ", sec, ": expected a [section] table"));
    for (auto&& [key, val] : *t) {
      const std::string k = sec + "." + std::string(key.str());
      auto it = values_.find(k);
      if (it == values_.end()) throw InputError(cat(path, ": unknown key ", k));
      Value& dst = it->second;
      const std::string where = cat(path, ": ", k, ": expected ", type_name(dst));
      if (std::holds_alternative<int64_t>(dst)) {
        auto v = val.value_exact<int64_t>();
        if (!v) throw InputError(where);
        dst = *v;
      } else if (std::holds_alternative<double>(dst)) {
        if (auto v = val.value_exact<double>()) dst = *v;
        else if (auto w = val.value_exact<int64_t>()) dst = static_cast<double>(*w);
        else throw InputError(where);
      } else if (std::holds_alternative<bool>(dst)) {
        auto v = val.value_exact<bool>();
        if (!v) throw InputError(where);
        dst = *v;
      } else {
        auto v = val.value_exact<std::string>();
        if (!v) throw InputError(where);
        dst = *v;
      }
      set_[k] = path;
    }
  }
}

void Config::apply_overrides(const std::vector<std::string>& overrides) {
  for (std::string o : overrides) {
    const std::string flag = o;
    while (o.starts_with("-")) o.erase(0, 1);
    auto eq = o.find('=');
    if (eq == std::string::npos)
      throw InputError(cat("flag ", flag, ": expected --section.key=value"));
    const std::string k = o.substr(0, eq), text = o.substr(eq + 1);
    auto it = values_.find(k);
    if (it == values_.end()) throw InputError(cat("flag ", flag, ": unknown key ", k));
    Value& dst = it->second;
    const std::string where = cat("flag ", flag, ": ", k, ": expected ", type_name(dst));
    if (std::holds_alternative<int64_t>(dst)) {
      int64_t v = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec != std::errc() || r.ptr != text.data() + text.size()) throw InputError(where);
      dst = v;
    } else if (std::holds_alternative<double>(dst)) {
      try {
        size_t used = 0;
        double v = std::stod(text, &used);
        if (used != text.size()) throw InputError(where);
        dst = v;
      } catch (const std::logic_error&) {
        throw InputError(where);
      }
    } else if (std::holds_alternative<bool>(dst)) {
      if (text == "true") dst = true;
      else if (text == "false") dst = false;
      else throw InputError(where + " (true or false)");
    } else {
      dst = text;
    }
    set_[k] = flag;
  }
}

void Config::check_param_servers(const std::function<std::string(const std::string&)>& where) const {
  if (const std::string& mode = s("parallel.ps_mode"); mode != "sync" && mode != "async" && mode != "ssp")
    throw InputError(cat(where("parallel.ps_mode"), " = \"", mode, "\": expected one of sync, async, ssp"));
  const int64_t servers = i("parallel.ps_servers");
  if (servers < 0) throw InputError(cat(where("parallel.ps_servers"), " = ", servers, ": expected >= 0 (0: no parameter servers)"));
  if (i("parallel.ps_staleness") < 0)
    throw InputError(cat(where("parallel.ps_staleness"), " = ", i("parallel.ps_staleness"), ": expected >= 0"));
  if (i("parallel.ps_staleness") != 0 && s("parallel.ps_mode") != "ssp")
    throw InputError(cat(where("parallel.ps_staleness"), " = ", i("parallel.ps_staleness"), " with parallel.ps_mode = \"",
                         s("parallel.ps_mode"), "\": a staleness bound is what ssp mode keeps; expected parallel.ps_mode = "
                         "\"ssp\" or ps_staleness = 0"));
  if (const std::string& h = s("parallel.ps_hierarchical"); h != "auto" && h != "on" && h != "off")
    throw InputError(cat(where("parallel.ps_hierarchical"), " = \"", h, "\": expected one of auto, on, off"));
  if (s("parallel.ps_hierarchical") == "on" && s("parallel.ps_mode") != "sync")
    throw InputError(cat(where("parallel.ps_hierarchical"), " = \"on\" with parallel.ps_mode = \"", s("parallel.ps_mode"),
                         "\": a host's workers sum their gradients in step, which only sync mode does; expected \"auto\" or "
                         "\"off\""));
  if (servers == 0) return;
  if (i("parallel.tp") != 1 || i("parallel.pp") != 1)
    throw InputError(cat(where("parallel.ps_servers"), " = ", servers, " with parallel.tp = ", i("parallel.tp"),
                         " and parallel.pp = ", i("parallel.pp"), ": parameter-server workers train the whole model; "
                         "expected tp = pp = 1"));
  if (i("parallel.zero") != 0)
    throw InputError(cat(where("parallel.ps_servers"), " = ", servers, " with parallel.zero = ", i("parallel.zero"),
                         ": the servers already shard the parameters and the optimizer state; expected zero = 0"));
  if (b("parallel.deterministic") && s("parallel.ps_mode") != "sync")
    throw InputError(cat(where("parallel.deterministic"), " = true with parallel.ps_mode = \"", s("parallel.ps_mode"),
                         "\": pushes applied as they arrive depend on timing; expected ps_mode = \"sync\" or "
                         "deterministic = false"));
  if (s("comm.grad_dtype") != "f32")
    throw InputError(cat(where("comm.grad_dtype"), " = \"", s("comm.grad_dtype"),
                         "\" with parameter servers: pushes carry f32 gradients; expected \"f32\""));
}

void Config::check_layout(const std::function<std::string(const std::string&)>& where) const {
  const int64_t dp = i("parallel.dp"), pp = i("parallel.pp"), v = i("parallel.virtual_stages");
  if (v > 1 && s("parallel.pp_schedule") != "interleaved")
    throw InputError(cat(where("parallel.virtual_stages"), " = ", v, ": several chunks per stage need parallel.pp_schedule = "
                         "\"interleaved\", not \"", s("parallel.pp_schedule"), "\""));
  const int64_t micro = i("training.global_batch") / (i("training.micro_batch") * dp);
  if (i("parallel.microbatches") != 0 && i("parallel.microbatches") != micro)
    throw InputError(cat(where("parallel.microbatches"), " = ", i("parallel.microbatches"), ": a step has training.global_batch / "
                         "(training.micro_batch x parallel.dp) = ", micro, " micro-batches; expected ", micro, " or 0"));
  if (pp > 1 && s("training.recompute") == "full" && s("parallel.pp_schedule") == "zb-h1")
    throw InputError(cat(where("training.recompute"), " = \"full\" with parallel.pp_schedule = \"zb-h1\": the deferred "
                         "weight passes need the activations full recompute discards; expected \"none\" or \"selective\""));
  if (const int64_t tp = i("parallel.tp"); tp > 1) {
    if (model_kind(*this) != "gpt")
      throw InputError(cat(where("parallel.tp"), " = ", tp, ": tensor parallelism splits a GPT's attention heads and MLP; "
                           "model.preset = \"", s("model.preset"), "\" is not a GPT"));
    if (i("model.n_head") % tp != 0)
      throw InputError(cat("model.n_head = ", i("model.n_head"), " attention heads are not divisible among parallel.tp = ", tp,
                           " tensor-parallel ranks"));
    if (i("model.vocab_size") % tp != 0)
      throw InputError(cat("model.vocab_size = ", i("model.vocab_size"), " rows of the vocab-parallel embedding are not divisible "
                           "among parallel.tp = ", tp, " tensor-parallel ranks (a larger vocab_size pads it: ids past the data's "
                           "are never seen)"));
  }
  if (b("parallel.sequence_parallel")) {
    const int64_t tp = i("parallel.tp"), rows = i("training.micro_batch") * i("model.seq_len");
    if (tp == 1)
      throw InputError(cat(where("parallel.sequence_parallel"), " = true with parallel.tp = 1: sequence parallelism splits "
                           "the rows between tensor-parallel ranks; expected parallel.tp > 1 or false"));
    if (pp > 1 && s("parallel.pp_schedule") == "zb-h1")
      throw InputError(cat(where("parallel.sequence_parallel"), " = true with parallel.pp_schedule = \"zb-h1\": the deferred "
                           "weight passes would need every row of the inputs sequence parallelism does not keep; expected "
                           "another schedule or false"));
    if (rows % tp != 0)
      throw InputError(cat("training.micro_batch x model.seq_len = ", i("training.micro_batch"), " x ", i("model.seq_len"),
                           " = ", rows, " rows are not divisible among parallel.tp = ", tp,
                           " ranks, as parallel.sequence_parallel = true needs"));
  }
  if (pp == 1) return;
  if (model_kind(*this) != "gpt")
    throw InputError(cat(where("parallel.pp"), " = ", pp, ": pipeline stages split a GPT's blocks; model.preset = \"",
                         s("model.preset"), "\" is not a GPT"));
  if (i("model.n_layer") % (pp * v) != 0)
    throw InputError(cat("model.n_layer = ", i("model.n_layer"), " blocks are not divisible among parallel.pp x "
                         "parallel.virtual_stages = ", pp, " x ", v, " = ", pp * v, " pipeline chunks"));
  if (i("parallel.zero") == 3)
    throw InputError(cat(where("parallel.zero"), " = 3 with parallel.pp = ", pp, ": ZeRO-3 gathers every block on every "
                         "rank, which pipeline stages exist to avoid; expected 0, 1 or 2"));
  const parallel::ScheduleKind kind = parallel::schedule_kind_named(s("parallel.pp_schedule"));
  const parallel::MicrobatchRule rule = parallel::microbatch_rule(kind, static_cast<int>(pp), static_cast<int>(v));
  if (micro < rule.minimum || micro % rule.multiple_of != 0)
    throw InputError(cat("training.global_batch / (training.micro_batch x parallel.dp) = ", micro, " micro-batches: the ",
                         s("parallel.pp_schedule"), " schedule over parallel.pp = ", pp, " stages needs at least ", rule.minimum,
                         rule.multiple_of > 1 ? cat(" and a multiple of ", rule.multiple_of) : std::string()));
}

int64_t Config::i(const std::string& key) const { return std::get<int64_t>(values_.at(key)); }
double Config::f(const std::string& key) const { return std::get<double>(values_.at(key)); }
bool Config::b(const std::string& key) const { return std::get<bool>(values_.at(key)); }
const std::string& Config::s(const std::string& key) const { return std::get<std::string>(values_.at(key)); }

std::string model_kind(const Config& c) { return find_preset(c.s("model.preset"))->kind; }

DType precision_format(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  LOOM_CHECK(name == "fp32");
  return DType::kF32;
}

void Config::resolve(int world) {
  const Preset* p = find_preset(s("model.preset"));
  if (p == nullptr)
    throw InputError(cat("model.preset: unknown preset \"", s("model.preset"),
                         "\"; expected gpt-nano, gpt-mini, gpt2-124m, gpt or mlp"));
  auto fill = [&](const char* key, int64_t v) {
    if (!explicitly_set(key)) values_[key] = v;
  };
  fill("model.n_layer", p->n_layer);
  fill("model.n_head", p->n_head);
  fill("model.d_model", p->d_model);
  fill("model.seq_len", p->seq_len);
  fill("model.vocab_size", p->vocab_size);
  // tp and pp are range-checked below; clamped here so that their product cannot overflow
  // before they are (the config fuzzer found tp x pp past 2^63).
  auto axis = [&](const char* key) { return std::clamp<int64_t>(i(key), 1, int64_t{1} << 20); };
  const int64_t model_parallel = axis("parallel.tp") * axis("parallel.pp");
  // Parameter servers take the first ranks; the workers are the data-parallel replicas.
  const int64_t servers = std::clamp<int64_t>(i("parallel.ps_servers"), 0, int64_t{1} << 20);
  const int64_t workers = world - servers;
  if (i("parallel.dp") == 0 && workers > 0 && workers % model_parallel == 0)
    values_["parallel.dp"] = workers / model_parallel;

  auto where = [&](const std::string& key) {
    auto it = set_.find(key);
    return it == set_.end() ? key + " (default)" : it->second == "code" ? key : cat(key, " (from ", it->second, ")");
  };
  const std::string kind = p->kind;
  check_ranges(kind, where);
  check_world(world, servers, where);
  check_values(where);
  check_modes(kind, where);
  check_layout(where);
  check_param_servers(where);
  check_rest(kind, where);
}

std::string Config::to_toml() const {
  std::ostringstream out;
  std::string section;
  for (const auto& [k, v] : values_) {
    std::string sec = k.substr(0, k.find('.'));
    if (sec != section) {
      out << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    out << k.substr(k.find('.') + 1) << " = ";
    if (auto* x = std::get_if<int64_t>(&v)) out << *x;
    else if (auto* d = std::get_if<double>(&v)) out << toml::value<double>(*d);
    else if (auto* bl = std::get_if<bool>(&v)) out << (*bl ? "true" : "false");
    else out << toml::value<std::string>(std::get<std::string>(v));
    out << "\n";
  }
  return out.str();
}

int Config::threads(int local_ranks) const {
  if (i("job.threads") > 0) return static_cast<int>(i("job.threads"));
  const int cores = available_cores();
  return std::max(1, cores / std::max(1, local_ranks));
}

void apply_compute_settings(const Config& c, int local_ranks) {
  train::apply_compute_settings({.threads = c.threads(local_ranks), .gemm = c.s("job.gemm"), .gemm_path = c.s("job.gemm_path")});
}

std::string Config::run_path() const {
  return (std::filesystem::path(s("job.run_dir")) / s("job.name")).string();
}

}  // namespace loom::app
