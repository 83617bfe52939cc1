// `loom train`'s configuration, typed (DESIGN.md section 4's keys, issue 41 item 4): what a
// run of the trainer (loom/train/train.h) is given. The command layer builds it once from a
// resolved config (apps/loom/config_train.h); nothing in the trainer reads a config key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/nn/gpt_config.h"
#include "loom/optim/optim.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/parallelize.h"

namespace loom::train {

// Its own fields default to `loom train`'s defaults for their keys (docs/config.md); the
// libraries' configs inside it (`schedule`, `parallel.step`, `model.gpt`) keep their
// libraries' defaults (no gradient clipping, min_lr 0, ...), and the fields the command layer
// derives from others must agree with them (check_config).
struct TrainConfig {
  struct Job {
    std::string run;  // the run directory: job.run_dir / job.name
    uint64_t seed = 1337;
    int threads = 1;  // compute threads per rank (job.threads, or this host's share of the cores)
    int64_t log_every = 10;
    double mem_limit_mb = 0;  // 0: none
    bool cuda = false;        // job.device = "cuda": the step on GPU 0 (docs/gpu.md)
    std::string gemm = "loom";       // who computes products: "loom" or "openblas"
    std::string gemm_path = "auto";  // Loom's GEMM micro-kernel by name (docs/config.md)
  } job;
  struct Model {
    std::string kind, preset;  // kind: "gpt" or "mlp"
    nn::GptConfig gpt;         // a GPT's shape
    int64_t hidden = 0, n_hidden = 0, classes = 0;  // an MLP's (its inputs come from the images)
  } model;
  struct Data {
    std::string train, val;  // val "" for none
    std::string tokenizer = "bytes";  // a data::Tokenizer spec
    bool hash_shards = true;  // data.verify = "hash": a manifest's shards are hashed at start (rank 0)
    bool document_windows = false;  // data.windows = "documents": windows start at documents (a manifest's indexes)
    int64_t prefetch = 4;     // micro-batches made ahead on a reader thread (0: made in the step)
    std::string cache_dir;    // remote shards' cache
    double cache_mb = 10240;  // its size bound
    int64_t fetch_retries = 5;
  } data;
  struct Training {
    int64_t steps = 0, global_batch = 1, micro_batch = 1, eval_every = 0, eval_steps = 10;
    nn::Recompute recompute = nn::Recompute::kNone;
    DType precision = DType::kF32;
    std::string precision_name = "fp32";  // "fp32", "bf16" or "fp16"
    bool keep_zeros = false;
    std::string teacher;  // "" for no distillation
    double distill_alpha = 0.5, distill_temperature = 1;
  } training;
  optim::ScheduleConfig schedule;
  struct Parallel {
    parallel::MeshShape layout;  // dp x pp (v chunks each) x tp
    int zero = 0;
    bool deterministic = false, sequence_parallel = false;
    std::string pp_schedule = "1f1b";  // the schedule's name (step.pp_schedule is its kind)
    parallel::StepConfig step;  // data parallelism, the optimizer, batches, clipping, fp16
    struct ParamServer {
      int servers = 0;  // 0: no parameter servers
      std::string mode = "sync", hierarchical = "auto";
      int64_t staleness = 0;
    } ps;
  } parallel;
  struct Comm {
    std::string transport = "auto";
    double timeout_s = 300;
  } comm;
  struct Checkpoint {
    std::string root;      // checkpoint.dir, or RUN/checkpoints
    bool own_dir = false;  // checkpoint.dir was given
    int keep = 3;
    int64_t every = 0;
    double every_s = 0, grace_s = 20;
    bool async = false;
    int sigterm_exit_code = 0;  // the exit status after a SIGTERM stop with a checkpoint
  } checkpoint;
  struct Profile {
    std::string trace_steps;      // as given, for messages
    std::vector<int64_t> steps;   // parsed, ascending
  } profile;
  struct Metrics {
    int port = 0;  // 0: no /metrics server
    std::string host = "127.0.0.1", api_key;  // api_key: LOOM_API_KEY
    bool every_rank = false;
    double peak_gflops = 0;
  } metrics;
  struct Debug {
    std::string fault_at, delay_ms;
    int64_t jitter_ms = 0;
  } debug;
  std::string toml;    // every key as resolved: the run's config.toml and checkpoints' state
  std::string layout;  // what every rank of a job must share, as one line
};

// Refuses a TrainConfig whose fields disagree (InputError naming the field, what it holds
// and what was expected): the sizes and names out of range, and the fields the command layer
// derives from others (parallel.step's batch, accumulation, positions, ZeRO stage and fp16,
// the schedule's length) not as derived. train::run checks its config so before anything
// is read or written; `loom train`'s always passes (apps/loom/config_train.cc builds it).
void check_config(const TrainConfig& t);

// Sizes this process's compute threads (job.threads) and picks who computes its products
// (job.gemm, job.gemm_path): process-wide, from one thread, before any work (train::run
// does it first). InputError naming job.gemm_path for a path unknown or not on this CPU.
void apply_compute_settings(const TrainConfig::Job& job);

}  // namespace loom::train
