// check_config (loom/train/train_config.h): what a TrainConfig built outside the command
// layer must hold before a run starts; apply_compute_settings, the job's compute threads and
// products.
#include "loom/train/train_config.h"

#include "kernels/gemm/gemm.h"
#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/parallel/schedule.h"

namespace loom::train {
namespace {

void expect(bool ok, const char* field, const std::string& holds, const std::string& expected) {
  if (!ok) throw InputError(cat("TrainConfig.", field, " = ", holds, ": expected ", expected));
}

}  // namespace

void check_config(const TrainConfig& t) {
  expect(!t.job.run.empty(), "job.run", "\"\"", "the run directory");
  expect(t.job.threads >= 1, "job.threads", cat(t.job.threads), "at least 1");
  expect(t.job.gemm == "loom" || t.job.gemm == "openblas", "job.gemm", cat("\"", t.job.gemm, "\""),
         "\"loom\" or \"openblas\"");
  expect(t.model.kind == "gpt" || t.model.kind == "mlp", "model.kind", cat("\"", t.model.kind, "\""), "\"gpt\" or \"mlp\"");
  expect(!t.data.train.empty(), "data.train", "\"\"", "a token file, a manifest or an image file");
  expect(t.training.steps >= 0, "training.steps", cat(t.training.steps), ">= 0");
  expect(t.training.micro_batch >= 1, "training.micro_batch", cat(t.training.micro_batch), "at least 1");
  const parallel::MeshShape& l = t.parallel.layout;
  expect(l.dp >= 1 && l.pp >= 1 && l.v >= 1 && l.tp >= 1, "parallel.layout",
         cat("dp ", l.dp, ", pp ", l.pp, ", v ", l.v, ", tp ", l.tp), "each at least 1");
  const int64_t replica_batch = int64_t{l.dp} * t.training.micro_batch;
  expect(t.training.global_batch >= replica_batch && t.training.global_batch % replica_batch == 0,
         "training.global_batch", cat(t.training.global_batch),
         cat("a multiple of parallel.layout.dp x training.micro_batch = ", replica_batch));
  const parallel::StepConfig& s = t.parallel.step;
  expect(s.micro_batch == t.training.micro_batch, "parallel.step.micro_batch", cat(s.micro_batch),
         cat("training.micro_batch = ", t.training.micro_batch));
  expect(s.accum == t.training.global_batch / replica_batch, "parallel.step.accum", cat(s.accum),
         cat("training.global_batch / parallel.layout.dp / training.micro_batch = ", t.training.global_batch / replica_batch));
  const int64_t positions = t.model.kind == "gpt" ? t.model.gpt.seq_len : 1;
  expect(s.t == positions, "parallel.step.t", cat(s.t), cat(t.model.kind == "gpt" ? "model.gpt.seq_len = " : "1 (an MLP) = ", positions));
  expect(s.dp.zero == t.parallel.zero, "parallel.step.dp.zero", cat(s.dp.zero), cat("parallel.zero = ", t.parallel.zero));
  expect(s.dp.deterministic == t.parallel.deterministic, "parallel.step.dp.deterministic",
         s.dp.deterministic ? "true" : "false", cat("parallel.deterministic = ", t.parallel.deterministic ? "true" : "false"));
  const bool fp16 = t.training.precision == DType::kF16;
  expect(s.fp16 == fp16, "parallel.step.fp16", s.fp16 ? "true" : "false",
         cat(fp16 ? "true" : "false", " (training.precision = ", dtype_name(t.training.precision), ")"));
  expect(s.pp_schedule == parallel::schedule_kind_named(t.parallel.pp_schedule), "parallel.step.pp_schedule",
         "another schedule", cat("the kind parallel.pp_schedule names (\"", t.parallel.pp_schedule, "\")"));
  expect(t.schedule.total_steps == t.training.steps, "schedule.total_steps", cat(t.schedule.total_steps),
         cat("training.steps = ", t.training.steps));
  expect(t.comm.timeout_s > 0, "comm.timeout_s", cat(t.comm.timeout_s), "> 0 seconds");
  expect(!t.checkpoint.root.empty(), "checkpoint.root", "\"\"", "the checkpoints' directory");
}

void apply_compute_settings(const TrainConfig::Job& job) {
  set_compute_threads(job.threads);
  kernels::set_gemm_backend(job.gemm == "openblas" ? kernels::GemmBackend::kOpenBlas : kernels::GemmBackend::kLoom);
  try {
    kernels::set_gemm_path(kernels::gemm_path_named(job.gemm_path));
  } catch (const InputError& e) {
    throw InputError(cat("job.gemm_path = \"", job.gemm_path, "\": ", e.what()));
  }
}

}  // namespace loom::train
