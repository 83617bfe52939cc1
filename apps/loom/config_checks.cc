// Config::resolve's checks (apps/loom/config.cc): ranges, the world, values, modes and the
// rest, in that order, each refusing the first problem with an InputError naming the key.
#include <algorithm>
#include <cstdlib>
#include <cmath>

#include "commands.h"
#include "config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/optim/loss_scale.h"
#include "loom/nn/gpt_config.h"
#include "loom/obs/trace.h"

namespace loom::app {
namespace {

// Checks shared by the parts of resolve(): each throws InputError naming the key as given.
struct Checks {
  const Config& c;
  const Config::Where& where;
  void positive(const std::string& key) const {
    if (c.i(key) <= 0) throw InputError(cat(where(key), " = ", c.i(key), ": expected a positive integer"));
  }
  void non_negative(const std::string& key) const {
    if (c.i(key) < 0) throw InputError(cat(where(key), " = ", c.i(key), ": expected >= 0"));
  }
  // Upper bounds keep every size derived from the config (a step's items, the data cursor,
  // the layout's ranks) inside int64 arithmetic; the memory plan then says whether it fits.
  void at_most(const std::string& key, int64_t hi) const {
    if (c.i(key) > hi) throw InputError(cat(where(key), " = ", c.i(key), ": expected at most ", hi));
  }
  void one_of(const std::string& key, std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (c.s(key) == a) return;
    std::string list;
    for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    throw InputError(cat(where(key), " = \"", c.s(key), "\": expected one of ", list));
  }
};

}  // namespace

void Config::check_ranges(const std::string& kind, const Where& where) const {
  const Checks chk{*this, where};
  for (const char* k : {"model.n_layer", "model.n_head", "model.vocab_size", "training.steps",
                        "training.global_batch", "training.micro_batch", "training.eval_steps",
                        "job.log_every", "parallel.tp", "parallel.pp", "parallel.virtual_stages"})
    chk.positive(k);
  for (const char* k : {"parallel.dp", "parallel.microbatches", "job.threads", "training.warmup_steps", "training.eval_every",
                        "checkpoint.every", "checkpoint.keep"})
    chk.non_negative(k);
  for (const char* k : {"model.n_layer", "model.n_head", "model.d_model", "model.seq_len", "model.hidden"})
    chk.at_most(k, INT32_MAX);
  for (const char* k : {"training.steps", "training.warmup_steps", "training.eval_every", "checkpoint.every", "job.log_every"})
    chk.at_most(k, int64_t{1} << 36);
  for (const char* k : {"training.global_batch", "training.micro_batch", "training.eval_steps"}) chk.at_most(k, int64_t{1} << 24);
  for (const char* k : {"parallel.dp", "parallel.tp", "parallel.pp", "parallel.virtual_stages", "parallel.microbatches",
                        "checkpoint.keep", "job.threads"})
    chk.at_most(k, int64_t{1} << 20);
  if (kind == "gpt") {
    chk.positive("model.d_model");
    chk.positive("model.seq_len");
    const nn::GptConfig g{.n_layer = i("model.n_layer"), .n_head = i("model.n_head"), .d_model = i("model.d_model"),
                          .seq_len = i("model.seq_len"), .vocab_size = i("model.vocab_size")};
    if (const std::string problem = nn::gpt_config_problem(g); !problem.empty())
      throw InputError(cat("model.", problem, explicitly_set("model.d_model") || explicitly_set("model.n_head")
                                                  ? cat(" (", where("model.d_model"), ", ", where("model.n_head"), ")")
                                                  : std::string()));
    if (i("model.vocab_size") > 65536)
      throw InputError(cat(where("model.vocab_size"), ": token files hold uint16 tokens, expected <= 65536"));
  } else {
    chk.positive("model.hidden");
  }
}

void Config::check_world(int world, int64_t servers, const Where& where) const {
  {
    const int64_t dp = i("parallel.dp"), tp = i("parallel.tp"), pp = i("parallel.pp");
    const int64_t workers = world - servers;
    if (servers > 0 && workers < 1)
      throw InputError(cat(where("parallel.ps_servers"), " = ", servers, ", but the job has ", world,
                           " rank(s): expected fewer servers than ranks, so that some ranks are workers"));
    if (dp * tp * pp != workers)
      throw InputError(cat("parallel.dp x parallel.tp x parallel.pp = ", dp, " x ", tp, " x ", pp, " = ", dp * tp * pp,
                           ", but the job has ", world, " rank(s)",
                           servers > 0 ? cat(" of which ", servers, " are parameter servers (parallel.ps_servers)") : "",
                           dp == 0 ? cat(" (not a multiple of tp x pp = ", tp * pp, ")") : std::string()));
  }
  if (i("training.global_batch") % (i("training.micro_batch") * i("parallel.dp")) != 0)
    throw InputError(cat("training.global_batch = ", i("training.global_batch"),
                         ": expected a multiple of training.micro_batch x parallel.dp = ",
                         i("training.micro_batch") * i("parallel.dp")));
}

void Config::check_values(const Where& where) const {
  // Names and paths are what they claim: no NUL (which would cut a path short), newline or
  // other control character in any text value, and UTF-8 throughout (what TOML can hold:
  // the run directory's config.toml reads back to the same values).
  for (const auto& [k, v] : values_)
    if (const std::string* x = std::get_if<std::string>(&v); x != nullptr && printable(*x) != *x)
      throw InputError(cat(where(k), " = \"", printable(*x), "\": contains a control character or bytes that are not UTF-8; "
                           "expected printable UTF-8 text"));
  // Values that make training meaningless are refused, not trained on: every number is
  // finite, and each hyperparameter is inside the range where its formula means something.
  for (const auto& [k, v] : values_)
    if (const double* x = std::get_if<double>(&v); x && !std::isfinite(*x))
      throw InputError(cat(where(k), " = ", *x, ": expected a finite number"));
  for (const char* k : {"training.lr", "training.min_lr", "training.weight_decay", "training.grad_clip", "training.eps"})
    if (!(f(k) >= 0)) throw InputError(cat(where(k), " = ", f(k), ": expected >= 0"));
  if (!(f("training.lr") > 0)) throw InputError(cat(where("training.lr"), ": expected > 0"));
  if (f("training.min_lr") > f("training.lr"))
    throw InputError(cat(where("training.min_lr"), " = ", f("training.min_lr"), ": expected <= training.lr = ", f("training.lr")));
  for (const char* k : {"training.beta1", "training.beta2", "training.momentum"})
    if (!(f(k) >= 0 && f(k) < 1)) throw InputError(cat(where(k), " = ", f(k), ": expected in [0, 1)"));
  if (s("training.optimizer") == "adamw" && !(f("training.eps") > 0))
    throw InputError(cat(where("training.eps"), " = ", f("training.eps"), ": AdamW divides by sqrt(v) + eps; expected > 0"));
}

void Config::check_modes(const std::string& kind, const Where& where) const {
  const Checks chk{*this, where};
  chk.one_of("training.decay", {"cosine", "linear", "constant"});
  chk.one_of("job.gemm", {"loom", "openblas"});
  chk.one_of("job.gemm_path", {"auto", "amx", "avx512_bf16", "avx512", "avx2", "generic"});
  if (s("job.gemm") != "loom" && s("job.gemm_path") != "auto")
    throw InputError(cat(where("job.gemm_path"), " = \"", s("job.gemm_path"), "\": picks a kernel of Loom's GEMM, but ",
                         where("job.gemm"), " = \"", s("job.gemm"), "\"; expected \"auto\""));
  chk.one_of("training.optimizer", {"adamw", "sgd"});
  chk.one_of("job.device", {"cpu", "cuda"});
  if (s("job.device") == "cuda") check_cuda(kind, where);
  chk.one_of("training.recompute", {"none", "selective", "full"});
  if (s("training.recompute") != "none" && kind != "gpt")
    throw InputError(cat(where("training.recompute"), " = \"", s("training.recompute"), "\": the ", kind,
                         " model has no transformer blocks to recompute; expected \"none\""));
  chk.one_of("training.precision", {"fp32", "bf16", "fp16"});
  if (const std::string prec = s("training.precision"); prec != "fp32") {
    const std::string at = cat(where("training.precision"), " = \"", prec, "\"");
    if (kind != "gpt")
      throw InputError(cat(at, ": mixed precision trains the gpt model; the ", kind, " model trains in fp32; expected \"fp32\""));
    if (i("parallel.tp") > 1 || i("parallel.ps_servers") > 0)
      throw InputError(cat(at, " with parallel.tp = ", i("parallel.tp"), " and parallel.ps_servers = ", i("parallel.ps_servers"),
                           ": mixed precision trains one process, data and pipeline parallel (any ZeRO stage); tensor-parallel "
                           "and parameter-server layouts train in fp32. Expected tp = 1 and no servers, or \"fp32\""));
    if (i("parallel.pp") > 1 && s("parallel.pp_schedule") == "zb-h1")
      throw InputError(cat(at, " with parallel.pp_schedule = \"zb-h1\": its deferred weight passes need a block's "
                           "activations after mixed precision's workspace has moved on; expected gpipe, 1f1b or interleaved"));
  }
  if (const double scale = f("training.loss_scale"); !optim::is_power_of_two(scale) || scale < 1 || scale > 16777216)
    throw InputError(cat(where("training.loss_scale"), " = ", scale, ": expected a power of two in [1, 2^24]"));
  if (i("training.loss_scale_window") < 1)
    throw InputError(cat(where("training.loss_scale_window"), " = ", i("training.loss_scale_window"), ": expected >= 1"));
  chk.one_of("comm.transport", {"auto", "shm", "tcp", "mpi"});
  chk.one_of("comm.grad_dtype", {"f32", "bf16"});
  chk.one_of("comm.param_dtype", {"f32", "bf16"});
  chk.one_of("parallel.pp_schedule", {"gpipe", "1f1b", "interleaved", "zb-h1"});
}

// job.device = "cuda" (docs/gpu.md): what the GPU trainer runs today.
void Config::check_cuda(const std::string& kind, const Where& where) const {
  const std::string at = cat(where("job.device"), " = \"cuda\"");
  if (kind != "gpt") throw InputError(cat(at, ": the GPU trains the gpt model; the ", kind, " model trains on the CPU"));
  if (s("training.precision") != "bf16")
    throw InputError(cat(at, " trains in bf16 mixed precision: expected ", where("training.precision"), " = \"bf16\", not \"",
                         s("training.precision"), "\""));
  if (s("training.optimizer") != "adamw")
    throw InputError(cat(at, " runs AdamW: expected ", where("training.optimizer"), " = \"adamw\""));
  if (i("parallel.tp") > 1 || i("parallel.pp") > 1 || i("parallel.ps_servers") > 0 || !s("training.teacher").empty())
    throw InputError(cat(at, " trains data parallel only, without tensor, pipeline or parameter-server parallelism or a "
                         "teacher: expected parallel.tp = 1, parallel.pp = 1, no servers and no training.teacher"));
  if (i("parallel.zero") > 2)
    throw InputError(cat(at, " runs ZeRO stages 1 and 2 (stage 3, the weights sharded between steps, is not built on "
                         "GPUs yet): expected ", where("parallel.zero"), " <= 2, not ", i("parallel.zero")));
  if (s("comm.grad_dtype") != "f32" || s("comm.param_dtype") != "f32")
    throw InputError(cat(at, " exchanges f32 gradients and weights: expected ", where("comm.grad_dtype"), " = \"f32\" and ",
                         where("comm.param_dtype"), " = \"f32\""));
  if (b("parallel.deterministic"))
    throw InputError(cat(at, ": the same bits on every layout (parallel.deterministic's exact sums) do not hold on the "
                         "GPU, whose runs repeat bit for bit only on one layout; expected ",
                         where("parallel.deterministic"), " = false"));
}

void Config::check_rest(const std::string& kind, const Where& where) const {
  if (b("training.keep_zeros") && (i("parallel.zero") == 3 || i("parallel.ps_servers") > 0))
    throw InputError(cat(where("training.keep_zeros"), " = true with ",
                         i("parallel.zero") == 3 ? "parallel.zero = 3, which keeps only a shard of each weight between steps"
                                                 : "parameter servers, which update the weights on the servers",
                         "; expected parallel.zero <= 2 and no parameter servers"));
  if (!(f("training.distill_alpha") >= 0 && f("training.distill_alpha") <= 1))
    throw InputError(cat(where("training.distill_alpha"), " = ", f("training.distill_alpha"),
                         ": the teacher's share of the loss; expected a number in [0, 1]"));
  if (!(f("training.distill_temperature") > 0 && f("training.distill_temperature") <= 100))
    throw InputError(cat(where("training.distill_temperature"), " = ", f("training.distill_temperature"),
                         ": expected a temperature in (0, 100]"));
  if (!s("training.teacher").empty() && kind != "gpt")
    throw InputError(cat(where("training.teacher"), " = \"", s("training.teacher"), "\": distillation needs the gpt model; the ",
                         kind, " model has no teacher"));
  if (i("parallel.zero") < 0 || i("parallel.zero") > 3)
    throw InputError(cat(where("parallel.zero"), " = ", i("parallel.zero"), ": expected 0, 1, 2 or 3"));
  if (!(f("parallel.bucket_mb") > 0)) throw InputError(cat(where("parallel.bucket_mb"), " = ", f("parallel.bucket_mb"), ": expected > 0"));
  if (!(f("job.mem_limit_mb") >= 0))
    throw InputError(cat(where("job.mem_limit_mb"), " = ", f("job.mem_limit_mb"), ": expected >= 0 (0: no limit)"));
  if (!(f("comm.timeout_s") > 0)) throw InputError(cat(where("comm.timeout_s"), " = ", f("comm.timeout_s"), ": expected > 0"));
  if (!(f("checkpoint.every_s") >= 0 && f("checkpoint.every_s") < 1e9))
    throw InputError(cat(where("checkpoint.every_s"), " = ", f("checkpoint.every_s"), ": expected seconds in [0, 1e9) (0: off)"));
  if (i("checkpoint.sigterm_exit_code") < 0 || i("checkpoint.sigterm_exit_code") > 255)
    throw InputError(cat(where("checkpoint.sigterm_exit_code"), " = ", i("checkpoint.sigterm_exit_code"), ": expected an exit status in [0, 255]"));
  if (!(f("checkpoint.grace_s") > 0 && f("checkpoint.grace_s") < 1e6))
    throw InputError(cat(where("checkpoint.grace_s"), " = ", f("checkpoint.grace_s"), ": expected seconds in (0, 1e6)"));
  if (b("parallel.deterministic") && s("comm.grad_dtype") != "f32")
    throw InputError(cat(where("comm.grad_dtype"), " = \"", s("comm.grad_dtype"),
                         "\": parallel.deterministic sums gradients exactly; expected \"f32\""));
  if (s("comm.param_dtype") != "f32" && i("parallel.zero") != 3)
    throw InputError(cat(where("comm.param_dtype"), " = \"", s("comm.param_dtype"), "\": only ZeRO-3 all-gathers parameters, and ",
                         where("parallel.zero"), " = ", i("parallel.zero"), "; expected \"f32\" or parallel.zero = 3"));
  if (b("parallel.deterministic") && s("comm.param_dtype") != "f32")
    throw InputError(cat(where("comm.param_dtype"), " = \"", s("comm.param_dtype"),
                         "\": parallel.deterministic computes with the exact f32 weights; expected \"f32\""));
  try {
    const std::vector<int64_t> traced = obs::parse_steps(s("profile.trace_steps"));
    if (!traced.empty() && traced.back() > i("training.steps"))
      throw InputError(cat("\"", s("profile.trace_steps"), "\": step ", traced.back(), " is past training.steps = ",
                           i("training.steps")));
  } catch (const InputError& e) {
    throw InputError(cat(where("profile.trace_steps"), " = ", e.what()));
  }
  if (i("metrics.port") < 0 || i("metrics.port") > 65535)
    throw InputError(cat(where("metrics.port"), " = ", i("metrics.port"), ": expected a TCP port in [1, 65535] (0: no metrics server)"));
  if (!(f("metrics.peak_gflops") >= 0 && f("metrics.peak_gflops") <= 1e9))
    throw InputError(cat(where("metrics.peak_gflops"), " = ", f("metrics.peak_gflops"), ": expected GFLOP/s per rank in [0, 1e9]"));
  if (i("metrics.port") > 0 && !loopback(s("metrics.host")) && std::getenv("LOOM_API_KEY") == nullptr)
    throw InputError(cat(where("metrics.host"), " = \"", printable(s("metrics.host")),
                         "\": metrics reachable from other hosts need an API key (LOOM_API_KEY)"));
  if (i("debug.jitter_ms") < 0 || i("debug.jitter_ms") > 1000000)
    throw InputError(cat(where("debug.jitter_ms"), " = ", i("debug.jitter_ms"), ": expected milliseconds in [0, 1e6] (0: off)"));
  if (s("job.name").empty() || s("job.name").find('/') != std::string::npos || s("job.name").starts_with("."))
    throw InputError(cat(where("job.name"), " = \"", s("job.name"), "\": expected a plain directory name"));
  if (s("data.train").empty()) throw InputError("data.train: expected a token file or \"fashion-mnist\"");
  if (s("data.verify") != "hash" && s("data.verify") != "size")
    throw InputError(cat(where("data.verify"), " = \"", printable(s("data.verify")), "\": expected \"hash\" or \"size\""));
  if (s("data.windows") != "tokens" && s("data.windows") != "documents")
    throw InputError(cat(where("data.windows"), " = \"", printable(s("data.windows")), "\": expected \"tokens\" or \"documents\""));
  if (!(f("data.cache_mb") > 0 && f("data.cache_mb") <= 1e9))
    throw InputError(cat(where("data.cache_mb"), " = ", f("data.cache_mb"), ": expected MiB in (0, 1e9]"));
  if (i("data.fetch_retries") < 0 || i("data.fetch_retries") > 100)
    throw InputError(cat(where("data.fetch_retries"), " = ", i("data.fetch_retries"), ": expected attempts in [0, 100]"));
  if (i("data.prefetch") < 0 || i("data.prefetch") > 1024)
    throw InputError(cat(where("data.prefetch"), " = ", i("data.prefetch"), ": expected micro-batches in [0, 1024] (0: none)"));
  if (s("model.preset") == "mlp" && s("data.tokenizer") != "bytes")
    throw InputError(cat(where("data.tokenizer"), " = \"", printable(s("data.tokenizer")),
                         "\": the mlp model reads images, not text; expected \"bytes\" (the default)"));
}

}  // namespace loom::app
