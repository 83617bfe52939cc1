// `loom report`: one self-contained HTML file about one or more runs (docs/observability.md):
// loss curves, throughput and MFU, the step time's split, memory per rank, restarts and
// steps lost, checkpoints, cost, and scaling across runs of one model on different world
// sizes. Charts are inline SVG; the page loads nothing (no scripts, fonts or images).
// Thread-safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::obs {

// What a run directory says about its run.
struct RunRecord {
  std::string dir;                     // as given
  std::string name;                    // the directory's name
  std::vector<nlohmann::json> steps;   // metrics.jsonl, one object per step
  std::vector<nlohmann::json> events;  // events.jsonl (empty for runs before Loom wrote it)
  std::vector<std::pair<int64_t, int64_t>> checkpoints;  // on disk now: step, bytes
};

// Reads a run directory: InputError naming the directory when it holds no metrics.jsonl or
// no step yet, and naming FILE:LINE for a line that is not a JSON object (a file cut short
// in the middle of a line included).
RunRecord read_run(const std::string& dir);

struct ReportOptions {
  double price_per_hour = 0;  // per rank (a GPU or a CPU socket): cost per step and per 1M tokens
  double peak_gflops = 0;     // per rank: MFU against it (0: achieved GFLOP/s only)
  std::string generated;      // when, as shown in the page's header
};

// The HTML page.
std::string render_report(const std::vector<RunRecord>& runs, const ReportOptions& o);

}  // namespace loom::obs
