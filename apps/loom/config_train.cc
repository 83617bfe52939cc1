#include "config_train.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/obs/trace.h"
#include "loom/train/debug_hooks.h"

namespace loom::app {

optim::OptimizerConfig optimizer_config(const Config& c) {
  return {.kind = c.s("training.optimizer"), .weight_decay = c.f("training.weight_decay"), .beta1 = c.f("training.beta1"),
          .beta2 = c.f("training.beta2"), .eps = c.f("training.eps"), .momentum = c.f("training.momentum"),
          .decay = {.decay_embeddings = c.b("training.decay_embeddings"),
                    .decay_norms_and_biases = c.b("training.decay_norms_and_biases")}};
}

optim::ScheduleConfig schedule_config(const Config& c) {
  return {.lr = c.f("training.lr"), .min_lr = c.f("training.min_lr"), .warmup_steps = c.i("training.warmup_steps"),
          .total_steps = c.i("training.steps"), .decay = c.s("training.decay")};
}

nn::GptConfig gpt_config(const Config& c) {
  return {.n_layer = c.i("model.n_layer"), .n_head = c.i("model.n_head"), .d_model = c.i("model.d_model"),
          .seq_len = c.i("model.seq_len"), .vocab_size = c.i("model.vocab_size")};
}

namespace {

parallel::StepConfig step_config(const Config& c) {
  const bool fp16 = c.s("training.precision") == "fp16";
  parallel::StepConfig s{
      .dp = {.zero = static_cast<int>(c.i("parallel.zero")), .bucket_mb = c.f("parallel.bucket_mb"),
             .deterministic = c.b("parallel.deterministic"),
             .grad_dtype = c.s("comm.grad_dtype") == "bf16" ? DType::kBF16 : DType::kF32,
             .param_dtype = c.s("comm.param_dtype") == "bf16" ? DType::kBF16 : DType::kF32},
      .optimizer = optimizer_config(c),
      .pp_schedule = parallel::schedule_kind_named(c.s("parallel.pp_schedule")),
      .micro_batch = c.i("training.micro_batch"),
      .accum = c.i("training.global_batch") / c.i("parallel.dp") / c.i("training.micro_batch"),
      .t = model_kind(c) == "mlp" ? 1 : c.i("model.seq_len"),
      .grad_clip = c.f("training.grad_clip"),
      .fp16 = fp16,
      .loss_scale = {.init = c.f("training.loss_scale"), .window = c.i("training.loss_scale_window")},
      .overflow_at = train::overflow_steps(c.s("debug.overflow_at"))};
  if (!s.overflow_at.empty() && !fp16)
    throw InputError(cat("debug.overflow_at is set but training.precision = \"", c.s("training.precision"),
                         "\": only fp16 scales the loss and skips an overflowing step; expected training.precision = \"fp16\""));
  return s;
}

// The settings every rank of a job must share, as one line ("dp=2 tp=1 ... d_model=64").
std::string layout_line(const Config& c) {
  return cat("dp=", c.i("parallel.dp"), " tp=", c.i("parallel.tp"), " pp=", c.i("parallel.pp"), " virtual_stages=",
             c.i("parallel.virtual_stages"), " pp_schedule=", c.s("parallel.pp_schedule"), " zero=", c.i("parallel.zero"),
             " sequence_parallel=", c.b("parallel.sequence_parallel"), " deterministic=", c.b("parallel.deterministic"),
             " ps_servers=", c.i("parallel.ps_servers"), " ps_mode=", c.s("parallel.ps_mode"),
             " ps_staleness=", c.i("parallel.ps_staleness"), " ps_hierarchical=", c.s("parallel.ps_hierarchical"),
             " global_batch=", c.i("training.global_batch"), " micro_batch=", c.i("training.micro_batch"),
             " n_layer=", c.i("model.n_layer"), " d_model=", c.i("model.d_model"));
}

}  // namespace

std::string default_cache_dir() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("LOOM_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return (fs::path(x) / "loom" / "shards").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache" / "loom" / "shards").string();
}

TrainConfig train_config(const Config& c, int local_ranks) {
  TrainConfig t;
  const std::string run = c.run_path();
  t.job = {.run = run, .seed = static_cast<uint64_t>(c.i("job.seed")), .threads = c.threads(local_ranks),
           .log_every = c.i("job.log_every"), .mem_limit_mb = c.f("job.mem_limit_mb"),
           .cuda = c.s("job.device") == "cuda", .gemm = c.s("job.gemm"), .gemm_path = c.s("job.gemm_path")};
  t.model = {.kind = model_kind(c), .preset = c.s("model.preset"), .gpt = gpt_config(c), .hidden = c.i("model.hidden"),
             .n_hidden = c.i("model.n_layer"), .classes = c.i("model.vocab_size")};
  t.data = {.train = c.s("data.train"), .val = c.s("data.val"), .tokenizer = c.s("data.tokenizer"),
            .hash_shards = c.s("data.verify") == "hash", .document_windows = c.s("data.windows") == "documents",
            .prefetch = c.i("data.prefetch"),
            .cache_dir = c.s("data.cache_dir").empty() ? default_cache_dir() : c.s("data.cache_dir"), .cache_mb = c.f("data.cache_mb"), .fetch_retries = c.i("data.fetch_retries")};
  t.training = {.steps = c.i("training.steps"), .global_batch = c.i("training.global_batch"),
                .micro_batch = c.i("training.micro_batch"), .eval_every = c.i("training.eval_every"),
                .eval_steps = c.i("training.eval_steps"), .recompute = nn::recompute_named(c.s("training.recompute")),
                .precision = precision_format(c.s("training.precision")), .precision_name = c.s("training.precision"),
                .keep_zeros = c.b("training.keep_zeros"), .teacher = c.s("training.teacher"),
                .distill_alpha = c.f("training.distill_alpha"), .distill_temperature = c.f("training.distill_temperature")};
  t.schedule = schedule_config(c);
  t.parallel = {.layout = {.dp = static_cast<int>(c.i("parallel.dp")), .pp = static_cast<int>(c.i("parallel.pp")),
                           .v = static_cast<int>(c.i("parallel.virtual_stages")), .tp = static_cast<int>(c.i("parallel.tp"))},
                .zero = static_cast<int>(c.i("parallel.zero")),
                .deterministic = c.b("parallel.deterministic"),
                .sequence_parallel = c.b("parallel.sequence_parallel"),
                .pp_schedule = c.s("parallel.pp_schedule"),
                .step = step_config(c),
                .ps = {.servers = static_cast<int>(c.i("parallel.ps_servers")), .mode = c.s("parallel.ps_mode"),
                       .hierarchical = c.s("parallel.ps_hierarchical"), .staleness = c.i("parallel.ps_staleness")}};
  t.comm = {.transport = c.s("comm.transport"), .timeout_s = c.f("comm.timeout_s")};
  const bool own_dir = !c.s("checkpoint.dir").empty();
  t.checkpoint = {.root = own_dir ? c.s("checkpoint.dir") : (std::filesystem::path(run) / "checkpoints").string(),
                  .own_dir = own_dir,
                  .keep = static_cast<int>(c.i("checkpoint.keep")),
                  .every = c.i("checkpoint.every"),
                  .every_s = c.f("checkpoint.every_s"),
                  .grace_s = c.f("checkpoint.grace_s"),
                  .async = c.b("checkpoint.async"),
                  .sigterm_exit_code = static_cast<int>(c.i("checkpoint.sigterm_exit_code"))};
  t.profile = {.trace_steps = c.s("profile.trace_steps"), .steps = obs::parse_steps(c.s("profile.trace_steps"))};
  t.metrics = {.port = static_cast<int>(c.i("metrics.port")), .host = c.s("metrics.host"),
               .api_key = std::getenv("LOOM_API_KEY") != nullptr ? std::getenv("LOOM_API_KEY") : "",
               .every_rank = c.b("metrics.every_rank"), .peak_gflops = c.f("metrics.peak_gflops")};
  t.debug = {.fault_at = c.s("debug.fault_at"), .delay_ms = c.s("debug.delay_ms"), .jitter_ms = c.i("debug.jitter_ms")};
  t.toml = c.to_toml();
  t.layout = layout_line(c);
  return t;
}

int layout_ranks(const Config& c, int fallback) {
  const int64_t dp = c.i("parallel.dp"), tp = c.i("parallel.tp"), pp = c.i("parallel.pp"), most = int64_t{1} << 20;
  if (dp > 0 && dp <= most && tp > 0 && tp <= most && pp > 0 && pp <= most && dp * tp * pp <= most)
    return static_cast<int>(dp * tp * pp + std::clamp<int64_t>(c.i("parallel.ps_servers"), 0, most));
  return fallback;
}

int usable_world(const Config& c, int available) {
  for (int w = available; w >= 1; --w) {
    Config trial = c;
    try {
      trial.resolve(w);
      return w;
    } catch (const InputError&) {
    }
  }
  return available;
}

MemoryPlan plan_memory(const TrainConfig& t, int world, const std::vector<int>& host_ranks) {
  const bool gpt = t.model.kind == "gpt";
  parallel::MemoryPlanInput in{
      .gpt = gpt,
      .mlp_hidden = gpt ? 0 : t.model.hidden,
      .mlp_layers = gpt ? 0 : t.model.n_hidden,
      .mlp_classes = gpt ? 0 : t.model.classes,
      .layout = t.parallel.layout,
      .pp_schedule = t.parallel.pp_schedule,
      .zero = t.parallel.zero,
      .deterministic = t.parallel.deterministic,
      .sequence_parallel = t.parallel.sequence_parallel,
      .micro_batch = t.training.micro_batch,
      .global_batch = t.training.global_batch,
      .recompute = t.training.recompute,
      .precision = t.training.precision,
      .optimizer_buffers = t.parallel.step.optimizer.kind == "adamw" ? 2 : 1,
      .train_data = t.data.train,
      .val_data = t.data.val};
  if (gpt) in.model = t.model.gpt;
  return parallel::plan_memory(in, world, host_ranks);
}

}  // namespace loom::app
