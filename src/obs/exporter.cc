// The training exporter (include/loom/obs/exporter.h): cpp-httplib's server on one thread.
#include "loom/obs/exporter.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/obs/metrics.h"

namespace loom::obs {

struct TrainingExporter::Server {
  httplib::Server http;
};

TrainingExporter::TrainingExporter(ExporterOptions o) : o_(std::move(o)), server_(std::make_unique<Server>()) {
  httplib::Server& http = server_->http;
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!o_.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + o_.api_key) {
      res.status = 401;
      res.set_content("unauthorized: expected \"Authorization: Bearer KEY\"\n", "text/plain");
      return;
    }
    res.set_content(text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second job bind
  // the same port and take half of the scrapes.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int port = o_.port > 0 ? (http.bind_to_port(o_.host, o_.port) ? o_.port : -1) : http.bind_to_any_port(o_.host);
  if (port <= 0)
    throw InputError(cat("metrics.port = ", o_.port, ": cannot listen on ", o_.host, ":", o_.port,
                         " (in use by another process, or not an address of this host)"));
  port_ = port;
  thread_ = std::thread([this] { server_->http.listen_after_bind(); });
  // Running before the constructor returns: a stop() that came first would be lost and the
  // listening thread never end.
  while (!server_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TrainingExporter::~TrainingExporter() {
  server_->http.stop();
  if (thread_.joinable()) thread_.join();
}

void TrainingExporter::set_run(double train_flops_per_token, int64_t world, int64_t restarts, int64_t steps_lost) {
  std::lock_guard lock(mu_);
  flops_per_token_ = train_flops_per_token;
  world_ = std::max<int64_t>(world, 1);
  restarts_ = restarts;
  steps_lost_ = steps_lost;
}

void TrainingExporter::observe(const std::string& json_line) {
  const nlohmann::json j = nlohmann::json::parse(json_line);
  std::lock_guard lock(mu_);
  for (const auto& [key, v] : j.items()) {
    if (v.is_number()) last_[key] = v.get<double>();
    if (!v.is_array()) continue;
    std::vector<double>& a = per_rank_[key];
    a.assign(v.size(), NAN);
    for (size_t r = 0; r < v.size(); ++r)
      if (v[r].is_number()) a[r] = v[r].get<double>();
  }
  if (!j.contains("ckpt_stall_ms")) last_.erase("ckpt_stall_ms");  // the stall is the step's, not the last save's
  for (const char* key : {"step_ms", "exposed_comm_ms", "tp_exposed_comm_ms", "pp_wait_ms", "data_wait_ms", "ckpt_stall_ms", "tokens"})
    if (j.contains(key) && j[key].is_number()) totals_[key] += j[key].get<double>();
  ++steps_seen_;
}

std::string TrainingExporter::text() const {
  std::lock_guard lock(mu_);
  const std::string rank = cat("rank=\"", o_.rank, "\"");
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  auto value = [](double v) { return std::isfinite(v) ? json_number(v) : std::string(std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"); };
  auto got = [&](const char* key) { return last_.contains(key) ? last_.at(key) : 0.0; };
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    family(name, type, help);
    out += cat(name, "{", rank, "} ", value(v), "\n");
  };
  one("loom_train_up", "gauge", "1 while this rank trains and serves these metrics", 1);
  if (steps_seen_ == 0) return out;
  one("loom_train_step", "gauge", "Optimizer steps completed", got("step"));
  one("loom_train_loss", "gauge", "Training loss of the latest step's global batch", got("loss"));
  if (last_.contains("val_loss")) one("loom_train_val_loss", "gauge", "Validation loss of the latest evaluation", got("val_loss"));
  one("loom_train_learning_rate", "gauge", "Learning rate of the latest step", got("lr"));
  one("loom_train_tokens_per_second", "gauge", "Tokens the latest step consumed per second, all ranks together", got("tokens_per_s"));
  const double flops = flops_per_token_ * got("tokens_per_s") / static_cast<double>(world_);
  one("loom_train_model_flops_per_second", "gauge", "Model FLOPs of training per second per rank (3 x forward, recompute not counted)", flops);
  if (o_.peak_gflops > 0)
    one("loom_train_mfu", "gauge", "Model FLOPs utilization: model FLOPs per second per rank over metrics.peak_gflops", flops / (o_.peak_gflops * 1e9));
  // The step's time split: what the training thread waited for, and the rest (compute).
  const double step = got("step_ms"), exposed = got("exposed_comm_ms") + got("tp_exposed_comm_ms") + got("pp_wait_ms");
  const double data = got("data_wait_ms"), ckpt = got("ckpt_stall_ms");
  family("loom_train_step_duration_seconds", "gauge", "The latest step's wall time, and its parts: compute (forward, backward, update), exposed communication, data wait, checkpoint stall");
  const std::pair<const char*, double> parts[] = {{"step", step},
                                                  {"compute", std::max(0.0, step - exposed - data - ckpt)},
                                                  {"exposed_communication", exposed},
                                                  {"data_wait", data},
                                                  {"checkpoint_stall", ckpt}};
  for (const auto& [part, ms] : parts) out += cat("loom_train_step_duration_seconds{", rank, ",part=\"", part, "\"} ", value(ms / 1e3), "\n");
  auto total = [&](const char* key) { return totals_.contains(key) ? totals_.at(key) : 0.0; };
  family("loom_train_time_seconds_total", "counter", "Time since this process started training, by part (as loom_train_step_duration_seconds)");
  const double t_step = total("step_ms"), t_exposed = total("exposed_comm_ms") + total("tp_exposed_comm_ms") + total("pp_wait_ms");
  const std::pair<const char*, double> totals[] = {{"step", t_step},
                                                   {"compute", std::max(0.0, t_step - t_exposed - total("data_wait_ms") - total("ckpt_stall_ms"))},
                                                   {"exposed_communication", t_exposed},
                                                   {"data_wait", total("data_wait_ms")},
                                                   {"checkpoint_stall", total("ckpt_stall_ms")}};
  for (const auto& [part, ms] : totals) out += cat("loom_train_time_seconds_total{", rank, ",part=\"", part, "\"} ", value(ms / 1e3), "\n");
  one("loom_train_tokens_total", "counter", "Tokens trained on since this process started", total("tokens"));
  // Memory: every rank's peaks from rank 0 (the line gathers them), a rank's own otherwise.
  family("loom_train_memory_peak_bytes", "gauge", "Peak resident memory of a rank in the latest step, evaluation or checkpoint save");
  const std::pair<const char*, const char*> phases[] = {{"mem_step_peak_mb", "step"}, {"mem_eval_peak_mb", "evaluation"}, {"mem_ckpt_peak_mb", "checkpoint"}};
  for (const auto& [key, phase] : phases) {
    if (!per_rank_.contains(key)) continue;
    const std::vector<double>& a = per_rank_.at(key);
    for (size_t r = 0; r < a.size(); ++r)
      if (o_.rank == 0 || static_cast<int>(r) == o_.rank)
        out += cat("loom_train_memory_peak_bytes{rank=\"", r, "\",phase=\"", phase, "\"} ", value(a[r] * 1048576.0), "\n");
  }
  family("loom_train_model_state_bytes", "gauge", "This rank's resident model state after the latest step");
  for (const auto& [key, kind] : std::vector<std::pair<const char*, const char*>>{{"mem_params_mb", "parameters"}, {"mem_grads_mb", "gradients"}, {"mem_optimizer_mb", "optimizer"}})
    out += cat("loom_train_model_state_bytes{", rank, ",kind=\"", kind, "\"} ", value(got(key) * 1048576.0), "\n");
  if (o_.rank == 0) {
    one("loom_train_restarts_total", "counter", "Restarts of the run (resumes and elastic generations), from events.jsonl", static_cast<double>(restarts_));
    one("loom_train_steps_lost_total", "counter", "Steps trained again after restarts, from events.jsonl", static_cast<double>(steps_lost_));
  }
  return out;
}

}  // namespace loom::obs
