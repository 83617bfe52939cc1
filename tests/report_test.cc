// `loom report` as a user meets it (docs/observability.md): runs on one and two ranks, one
// of them resumed, reported together: every section and chart is there, the page loads
// nothing, headless Chromium renders it without a console message, and bad run
// directories are one line each with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "cli_fixture.h"
#include "loom/core/fileio.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

constexpr const char* kChromium = "/usr/bin/chromium";

class Report : public Cli {
 protected:
  // Paths of the page's charts: each <svg>'s <path d="..."> values.
  static std::vector<std::vector<std::string>> chart_paths(const std::string& html) {
    std::vector<std::vector<std::string>> out;
    for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
      const size_t end = html.find("</svg>", at);
      const std::string svg = html.substr(at, end - at);
      std::vector<std::string> paths;
      const std::regex d("<path d=\"([^\"]*)\"");
      for (auto it = std::sregex_iterator(svg.begin(), svg.end(), d); it != std::sregex_iterator(); ++it) paths.push_back((*it)[1]);
      out.push_back(std::move(paths));
    }
    return out;
  }
};

TEST_F(Report, RunsOnOneAndTwoRanksOneResumedInOnePage) {
  const std::string det = cat(" --quiet --parallel.deterministic=true --training.steps=4");
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), det, " --job.name=one")).code, 0);
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det, " --job.name=two"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // "one" resumed for 2 more steps: a second start in its events.
  r = loom(cat("train ", p("nano.toml"), " --quiet --parallel.deterministic=true --training.steps=6 --job.name=one --resume"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string events = read_file(p("runs/one/events.jsonl"));
  EXPECT_NE(events.find("\"event\": \"start\", \"time\": "), std::string::npos) << events;
  EXPECT_NE(events.find("\"how\": \"resumed\", \"steps_lost\": 0, \"world\": 1"), std::string::npos) << events;
  EXPECT_NE(events.find("\"event\": \"end\""), std::string::npos) << events;
  EXPECT_NE(read_file(p("runs/two/events.jsonl")).find("\"world\": 2"), std::string::npos);

  r = loom(cat("report ", p("runs/one"), " ", p("runs/two"), " --out ", p("report.html"), " --price-per-hour 2.5 --peak-gflops 40"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(p("report.html")), std::string::npos) << r.out;
  const std::string html = read_file(p("report.html"));
  for (const char* want : {"<h2>one</h2>", "<h2>two</h2>", "Loss", "Throughput", "Model FLOPs utilization", "Step time, split",
                           "Peak resident memory per rank", "Starts and restarts", "1 restart(s), 0 step(s) lost", "Checkpoints",
                           "step_6", "Cost", "per 1M tokens", "<h2>Scaling</h2>", "scaling efficiency"})
    EXPECT_NE(html.find(want), std::string::npos) << want;
  // Self-contained: no script, no link, nothing fetched.
  for (const char* never : {"<script", "<link", "src=", "href=", "url(", "@import"})
    EXPECT_EQ(html.find(never), std::string::npos) << never;
  // Every chart has a path of at least two points.
  const auto charts = chart_paths(html);
  EXPECT_GE(charts.size(), 10u);
  for (size_t c = 0; c < charts.size(); ++c) {
    ASSERT_FALSE(charts[c].empty()) << "chart " << c;
    for (const std::string& d : charts[c]) EXPECT_TRUE(d.starts_with("M") && d.find(" L") != std::string::npos) << d;
  }
  // One run alone: its page lands in its own directory.
  r = loom(cat("report ", p("runs/two")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(p("runs/two/report.html")));

  if (!fs::exists(kChromium)) GTEST_SKIP() << kChromium << " is not installed (scripts/setup.sh installs it): the page was not rendered";
  const testing::CommandResult shot = testing::run_command(
      cat("timeout 60 ", kChromium, " --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot=", p("report.png"),
          " --window-size=1400,2400 --enable-logging=stderr --v=0 file://", p("report.html"), " 2>&1"));
  ASSERT_EQ(shot.code, 0) << shot.out;
  EXPECT_EQ(shot.out.find(":CONSOLE"), std::string::npos) << "a console message:\n" << shot.out;
  const std::string png = read_file(p("report.png"));
  ASSERT_GT(png.size(), 24u);
  auto be32 = [&](size_t at) {
    return (uint32_t{static_cast<uint8_t>(png[at])} << 24) | (uint32_t{static_cast<uint8_t>(png[at + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(png[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(png[at + 3])};
  };
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_EQ(be32(16), 1400u);
  EXPECT_EQ(be32(20), 2400u);
  EXPECT_GT(png.size(), 30000u) << "a page of charts, not a blank one";
}

TEST_F(Report, BadRunDirectoriesAreOneLineAndNothingIsWritten) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=2 --job.name=ok")).code, 0);
  auto refused = [&](const std::string& args, const std::string& want) {
    const Result r = loom(cat("report ", args, " --out ", p("bad.html")));
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_FALSE(fs::exists(p("bad.html")));
  };
  refused(p("runs/nowhere"), "runs/nowhere: not a run directory");
  fs::create_directories(p("runs/empty"));
  refused(p("runs/empty"), "runs/empty: not a run directory, or no step yet (no metrics.jsonl)");
  // metrics.jsonl cut in the middle of its last line, then holding nothing.
  fs::copy(p("runs/ok"), p("runs/cut"), fs::copy_options::recursive);
  const std::string metrics = read_file(p("runs/cut/metrics.jsonl"));
  write(p("runs/cut/metrics.jsonl"), metrics.substr(0, metrics.size() - 20));
  refused(cat(p("runs/ok"), " ", p("runs/cut")), "runs/cut/metrics.jsonl:2: not a JSON object (the file ends in the middle of a line: cut short?)");
  write(p("runs/cut/metrics.jsonl"), "");
  refused(p("runs/cut"), "metrics.jsonl: no step recorded yet");
  refused(cat(p("runs/ok"), " --price-per-hour -1"), "--price-per-hour -1: expected");
  refused(cat(p("runs/ok"), " --peak-gflops nan"), "--peak-gflops");
  fs::create_directories(p("bad.html/x"));
  const Result r = loom(cat("report ", p("runs/ok"), " --out ", p("bad.html")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("a directory; expected a file name"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace loom
