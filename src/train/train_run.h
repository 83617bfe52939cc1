// One rank's run (loom/train/train.h; train.cc: the model built, the run directory claimed,
// the weights loaded, the model laid out; train_step.cc: the steps and what follows each;
// train_ps.cc: a parameter-server job's roles). Internal to src/train/.
// Thread-safety: the training thread's.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/checkpoint/checkpoint.h"
#include "loom/parallel/checkpointing.h"
#include "loom/data/data.h"
#include "loom/obs/exporter.h"
#include "loom/obs/metrics.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/ps_job.h"
#include "loom/comm/rendezvous.h"
#include "loom/parallel/step_tracer.h"
#include "loom/obs/straggler.h"
#include "loom/obs/trace.h"
#include "loom/checkpoint/run_dir.h"
#include "loom/data/prefetch.h"
#include "loom/train/train.h"
#include "loom/train/workload.h"

namespace loom::train {

// One rank's run after its config is resolved: the model built, the run
// directory claimed, the weights loaded, the job joined and the model laid out, then the
// steps with their metrics, evaluations and checkpoints. The methods run in that order.
// With parameter servers ([parallel] ps_servers > 0) a worker steps through the same
// parallel::Parallelized interface (its step pushes to and pulls from the servers), and a
// server's rank serves() instead of stepping: the first server keeps the run's books.
class TrainRun {
 public:
  TrainRun(const RunOptions& a, RunStart& job);
  void build_model();
  void claim_run_dir();
  void load_weights();
  void parallelize();
  void open_outputs();
  // A parameter server's rank: serve() in place of the steps.
  bool serves() const { return ps_ && ps_->server(); }
  int serve();
  int64_t start_step() const { return start_step_; }
  // Whether the run goes on to `step` (0-based): not past training.steps, not stopped early
  // (SIGTERM, a resize); a parameter-server worker: until the servers say the run is over.
  bool goes_on(int64_t step) const;
  void step(int64_t step);
  int finish();

 private:
  void check_finite();
  void train_step(int64_t step);
  void after_step(int64_t done, double loss, double step_s, double busy_ms, obs::JsonLine& line, bool tracing);
  // The model as the logs name it: its preset, or its kind where the config named none.
  const std::string& model_name() const { return t_.model.preset.empty() ? t_.model.kind : t_.model.preset; }
  void log_start();
  void log_stage_state(const parallel::StateBytes& mem);
  std::array<bool, 3> agree(int64_t done, double busy_ms, obs::JsonLine& line);
  // A checkpoint's state.json of `step` (data cursor, generators, model, config); save() adds
  // fp16's loss scale.
  nlohmann::json checkpoint_state(int64_t step) const;
  // checkpoint.keep, and the files kept beside the shards (the tokenizer's).
  checkpoint::SaveOptions save_options(bool loss_finite) const;
  double save(int64_t step, bool loss_finite);
  void saved(const std::optional<std::string>& dir);
  void print_summary() const;
  void write_start_event();
  void write_end_event();
  // Parameter servers (train_ps.cc).
  void join_ps();
  void ps_step(int64_t step);
  int finish_ps();
  void log_ps_start();
  int rank() const { return ps_ ? ps_->rank() : env_.rank; }  // in the job (a joined worker's too)
  std::string role() const;  // "parameter server S" / "worker W" / "joined worker rank R", for errors

  const RunOptions& a_;
  comm::LaunchEnv& env_;
  const TrainConfig& t_;
  RunStart& job_;
  const bool lead_;  // writes the run directory, metrics and checkpoints
  const bool in_place_;  // an existing run directory goes on (an elastic generation, --resume-if-saved)
  const bool resume_;
  const int64_t steps_, global_batch_, micro_batch_, per_rank_;

  parallel::Mesh mesh_;
  Workload w_;
  std::optional<checkpoint::RunDirectory> run_dir_;
  std::optional<checkpoint::Checkpoint> ck_;
  std::optional<std::pair<double, int64_t>> saved_scale_;  // fp16's loss scale and clean steps, resumed
  std::string nonfinite_seen_;  // the last report of NaN or Inf in what this rank read
  double load_s_ = 0;
  int64_t start_step_ = 0, end_step_ = 0;
  std::unique_ptr<comm::TcpStoreServer> server_;
  std::unique_ptr<comm::Store> store_;
  std::unique_ptr<comm::Communicator> world_;
  std::optional<parallel::PsJob> ps_;  // [parallel] ps_servers > 0
  std::unique_ptr<parallel::ParamServer> ps_server_;  // a server's
  std::unique_ptr<parallel::Parallelized> pm_;
  std::vector<uint8_t> zeros_kept_;  // [training] keep_zeros
  std::optional<obs::Trace> trace_;
  std::optional<parallel::StepTracer> tracer_;
  std::optional<obs::MetricsFile> metrics_;
  std::optional<obs::MetricsFile> events_;  // rank 0's events.jsonl
  std::optional<obs::TrainingExporter> exporter_;  // metrics.port: /metrics while training
  int64_t steps_lost_ = 0;  // since the checkpoint this start resumed from
  std::optional<data::Sampler> sampler_;
  // data.prefetch > 0 (not parameter servers): micro-batch n = step * micro-batches + m is
  // made ahead from a sampler of its own (its items function runs on the reader's thread
  // and, for a batch asked out of order, on the step's: prefetch_mu_ keeps them apart).
  std::mutex prefetch_mu_;
  std::optional<data::Sampler> prefetch_sampler_;
  std::optional<data::Prefetcher> prefetcher_;
  // Micro-batch m of step `step`: this replica's items, drawn from `sampler`.
  std::vector<int64_t> items_of(data::Sampler& sampler, int64_t step, int64_t m) const;
  std::optional<obs::Progress> progress_;
  std::optional<parallel::CheckpointSaver> saver_;
  std::optional<obs::StragglerWatch> stragglers_;
  nlohmann::json layout_;
  std::string last_checkpoint_;
  parallel::EvalResult last_eval_;
  double tokens_per_step_ = 0;
  double ema_step_s_ = 0, comm_ms_total_ = 0, exposed_ms_total_ = 0, step_s_total_ = 0, bubble_total_ = 0,
         predicted_total_ = 0, replayed_total_ = 0;
  double ckpt_stall_ms_ = -1;  // of the save after the last step, for the next step's line
  struct {
    double step = 0, eval = -1, ckpt = -1;  // MiB; -1: none since the last line
  } peaks_;  // this rank's peak resident memory in each phase (loom/core/host.h)
  int64_t delay_ms_ = 0;
  int exit_code_ = 0;
  bool stopped_on_sigterm_ = false;  // SIGTERM stopped the run before its last step, after a save
  std::chrono::steady_clock::time_point last_save_;
  std::optional<std::chrono::steady_clock::time_point> terminate_seen_;
};

inline double mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace loom::train
