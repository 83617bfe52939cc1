// Prometheus metrics while training (docs/observability.md, "Prometheus"): an HTTP server
// on its own thread answers GET /metrics with the latest step's figures in Prometheus's
// text format (HELP and TYPE for every family; names that `promtool check metrics`
// accepts). The training thread hands it each step's metrics.jsonl line.
// Thread-safety: observe() and set_*() from the training thread, while the server's thread
// renders; a mutex keeps them apart.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::obs {

struct ExporterOptions {
  std::string host = "127.0.0.1";
  int port = 0;            // 0: any free port (port() says which)
  std::string api_key;     // "": none; else every request needs "Authorization: Bearer KEY"
  int rank = 0;            // the rank label of this process's series
  double peak_gflops = 0;  // per rank: loom_train_mfu against it (0: not exported)
};

class TrainingExporter {
 public:
  // Listens at once: InputError naming host and port when it cannot (in use, not an
  // address of this host).
  explicit TrainingExporter(ExporterOptions o);
  ~TrainingExporter();
  TrainingExporter(const TrainingExporter&) = delete;
  TrainingExporter& operator=(const TrainingExporter&) = delete;
  int port() const { return port_; }
  // The run's constants: training FLOPs per token, the world size, and (rank 0) the
  // restarts and steps lost so far, from events.jsonl.
  void set_run(double train_flops_per_token, int64_t world, int64_t restarts, int64_t steps_lost);
  // A step's metrics.jsonl line (docs/formats.md).
  void observe(const std::string& json_line);
  // The exposition text as GET /metrics returns it.
  std::string text() const;

 private:
  struct Server;
  ExporterOptions o_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::map<std::string, double> last_;                    // the latest line's numbers, by key
  std::map<std::string, std::vector<double>> per_rank_;   // its per-rank arrays (mem_*_peak_mb), the latest seen
  std::map<std::string, double> totals_;                  // counters summed over the steps
  int64_t steps_seen_ = 0;
  double flops_per_token_ = 0;
  int64_t world_ = 1, restarts_ = 0, steps_lost_ = 0;
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

}  // namespace loom::obs
