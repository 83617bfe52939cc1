// `loom report RUN... [--out FILE] [--price-per-hour X] [--peak-gflops G]`: one HTML page
// about the runs (src/obs/report.cc draws it; docs/observability.md).
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/obs/report.h"

namespace loom::app {
namespace fs = std::filesystem;

int run_report(const ReportArgs& a) {
  if (!(a.price_per_hour >= 0 && a.price_per_hour <= 1e6))
    throw InputError(cat("--price-per-hour ", a.price_per_hour, ": expected a price per rank-hour in [0, 1e6]"));
  if (!(a.peak_gflops >= 0 && a.peak_gflops <= 1e9))
    throw InputError(cat("--peak-gflops ", a.peak_gflops, ": expected GFLOP/s per rank in [0, 1e9]"));
  std::vector<obs::RunRecord> runs;
  for (const std::string& dir : a.runs) runs.push_back(obs::read_run(dir));
  const std::string out = !a.out.empty() ? a.out : runs.size() == 1 ? (fs::path(a.runs[0]) / "report.html").string() : "report.html";
  if (std::error_code ec; fs::is_directory(out, ec)) throw InputError(cat("--out ", printable(out), ": a directory; expected a file name"));
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  write_file_atomic(out, obs::render_report(runs, {.price_per_hour = a.price_per_hour, .peak_gflops = a.peak_gflops, .generated = when}));
  std::printf("report: %s\n", printable(out).c_str());
  return 0;
}

}  // namespace loom::app
