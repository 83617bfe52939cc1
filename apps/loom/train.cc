// `loom train`: one process trains a model on real data, writing the run directory
// (DESIGN.md section 4): config.toml, metrics.jsonl, checkpoints/step_N, logs/.
#include <sys/resource.h>

#include <chrono>
#include <filesystem>

#include "commands.h"
#include "config.h"
#include "loom/checkpoint.h"
#include "loom/data.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "loom/log.h"
#include "loom/metrics.h"
#include "loom/optim.h"
#include "loom/threads.h"
#include "task.h"

namespace loom::app {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double peak_rss_mb() {
  struct rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// Keeps the metrics lines of steps <= last_step (a resumed run rewrites what follows).
void truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return;
  std::string kept, all = read_file(path);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line is dropped
    std::string line = all.substr(pos, nl - pos + 1);
    try {
      if (json::parse(line).value("step", int64_t{0}) <= last_step) kept += line;
    } catch (const json::exception&) {
    }
    pos = nl + 1;
  }
  write_file_atomic(path, kept);
}

}  // namespace

int run_train(const TrainArgs& a) {
  Config c;
  c.merge_file(a.config);
  c.apply_overrides(a.overrides);
  c.resolve();
  set_log_quiet(a.quiet);
  const int threads = c.threads();
  set_compute_threads(threads);

  const std::string run = c.run_path();
  const std::string ckpt_root = c.s("checkpoint.dir").empty() ? (fs::path(run) / "checkpoints").string() : c.s("checkpoint.dir");
  if (fs::exists(run) && !a.resume)
    throw InputError(cat(run, ": run directory exists; pass --resume to continue it, or set job.name or job.run_dir"));
  if (a.resume && !fs::exists(run))
    throw InputError(cat(run, ": --resume given but the run directory does not exist"));

  // Everything that can be wrong with the input is found before anything is written.
  std::unique_ptr<Task> task = make_task(c);
  ParamSet& params = task->params();
  optim::OptimizerConfig oc{.kind = c.s("training.optimizer"), .weight_decay = c.f("training.weight_decay"),
                            .beta1 = c.f("training.beta1"), .beta2 = c.f("training.beta2"),
                            .eps = c.f("training.eps"), .momentum = c.f("training.momentum"),
                            .decay = {.decay_embeddings = c.b("training.decay_embeddings"),
                                      .decay_norms_and_biases = c.b("training.decay_norms_and_biases")}};
  auto optimizer = optim::make_optimizer(oc, params);
  const int64_t steps = c.i("training.steps");
  optim::ScheduleConfig sched{.lr = c.f("training.lr"), .min_lr = c.f("training.min_lr"),
                              .warmup_steps = c.i("training.warmup_steps"), .total_steps = steps,
                              .decay = c.s("training.decay")};
  const int64_t global_batch = c.i("training.global_batch"), micro_batch = c.i("training.micro_batch");
  const int64_t accum = global_batch / micro_batch;
  const auto seed = static_cast<uint64_t>(c.i("job.seed"));

  int64_t start_step = 0;
  if (a.resume) {
    if (!checkpoint::latest_step_dir(ckpt_root)) throw InputError(cat(ckpt_root, ": --resume given but there is no checkpoint"));
    checkpoint::Checkpoint ck = checkpoint::Checkpoint::open(ckpt_root);
    if (ck.state().value("model", json()) != task->model_json())
      throw InputError(cat(ck.path(), ": checkpoint of model ", ck.state().value("model", json()).dump(),
                           ", the config builds ", task->model_json().dump()));
    ck.load_params(params);
    ck.load_optimizer(params, *optimizer);
    start_step = ck.state().at("step").get<int64_t>();
    // All randomness is counter-based on (seed, stream, epoch); a different seed would
    // silently change the data order, so it is refused.
    const auto saved_seed = ck.state().at("rng").at("seed").get<uint64_t>();
    if (saved_seed != seed)
      throw InputError(cat(ck.path(), ": trained with job.seed = ", saved_seed, ", the config says ", seed,
                           "; resume with the same seed"));
    log_info(cat("resuming from ", ck.path(), " at step ", start_step));
  }

  fs::create_directories(fs::path(run) / "logs");
  write_file_atomic((fs::path(run) / "config.toml").string(), c.to_toml());
  const std::string metrics_path = (fs::path(run) / "metrics.jsonl").string();
  if (a.resume) truncate_metrics(metrics_path, start_step);
  obs::MetricsFile metrics(metrics_path);

  data::Sampler sampler(task->train_items(), seed);
  obs::Progress progress(steps, c.i("job.log_every"), a.quiet);
  log_info(cat("training ", c.s("model.preset"), " (", params.numel(), " parameters) on ", c.s("data.train"), ": ",
               steps, " steps of ", global_batch, " x ", task->tokens_per_item(), " tokens, ", threads,
               " thread(s); run directory ", run));
  const double tokens_per_step = static_cast<double>(global_batch * task->tokens_per_item());
  double ema_step_s = 0;
  EvalResult last_eval;

  auto save = [&](int64_t step) {
    json rng = {{"generator", "xoshiro256** (splitmix64-seeded)"}, {"seed", seed},
                {"streams", {{"init", 1}, {"data_epoch_e", "1000 + e"}}},
                {"data_epoch", step * global_batch / task->train_items()}};
    json state = {{"data_cursor", step * global_batch}, {"rng", rng}, {"model", task->model_json()},
                  {"config", c.to_toml()}};
    std::string dir = checkpoint::save(ckpt_root, step, params, optimizer.get(), state,
                                       {.keep = static_cast<int>(c.i("checkpoint.keep"))});
    progress.note(cat("checkpoint ", dir));
  };

  for (int64_t step = start_step; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    params.zero_grads();
    double loss = 0;
    for (int64_t m = 0; m < accum; ++m) {
      std::vector<int64_t> items(static_cast<size_t>(micro_batch));
      for (int64_t i = 0; i < micro_batch; ++i) items[i] = sampler.item(step * global_batch + m * micro_batch + i);
      loss += task->micro_step(items, 1.0 / static_cast<double>(accum));
    }
    loss /= static_cast<double>(accum);
    const double grad_norm = optim::clip_grad_norm(params, c.f("training.grad_clip"));
    const double lr = optim::lr_at(sched, step);
    optimizer->step(lr);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ema_step_s = step == start_step ? step_s : 0.9 * ema_step_s + 0.1 * step_s;

    const int64_t done = step + 1;
    obs::JsonLine line;
    line.add("step", done).add("loss", loss).add("lr", lr).add("grad_norm", grad_norm)
        .add("tokens", static_cast<int64_t>(tokens_per_step)).add("step_ms", step_s * 1e3)
        .add("tokens_per_s", tokens_per_step / step_s).add("mem_peak_mb", peak_rss_mb());
    const int64_t eval_every = c.i("training.eval_every");
    if (task->has_validation() && ((eval_every > 0 && done % eval_every == 0) || done == steps)) {
      last_eval = task->evaluate(c.i("training.eval_steps") * micro_batch);
      line.add("val_loss", last_eval.loss);
      if (last_eval.accuracy >= 0) line.add("val_accuracy", last_eval.accuracy);
      progress.note(cat("step ", done, ": val_loss ", last_eval.loss,
                        last_eval.accuracy >= 0 ? cat(", val_accuracy ", last_eval.accuracy) : std::string()));
    }
    metrics.write(line);
    progress.update(done, loss, tokens_per_step / step_s, ema_step_s);
    const int64_t every = c.i("checkpoint.every");
    if ((every > 0 && done % every == 0) || done == steps) save(done);
  }
  progress.finish();
  if (task->has_validation() && last_eval.items > 0 && last_eval.accuracy >= 0) {
    // A full pass over the test set for the final figure.
    EvalResult full = task->evaluate(0);
    std::printf("test accuracy %.4f over %lld images (loss %.4f)\n", full.accuracy,
                static_cast<long long>(full.items), full.loss);
  }
  std::printf("run directory: %s\n", run.c_str());
  return 0;
}

}  // namespace loom::app
