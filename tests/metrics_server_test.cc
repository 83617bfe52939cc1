// Prometheus metrics while training (docs/observability.md, "Prometheus"): two ranks each
// serve /metrics (metrics.every_rank) behind an API key; the exposition passes
// `promtool check metrics`; Debian's Prometheus, started on loopback with a 1 s scrape,
// reads back loss values that are metrics.jsonl's; a port in use is one line and nothing
// is written.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "processes.h"
#include "loom/core/fileio.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using testing::accepts;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

class MetricsServer : public Cli {
 protected:
  void TearDown() override {
    if (prometheus_ > 0) {
      ::kill(prometheus_, SIGTERM);
      testing::wait_exit(prometheus_);
    }
    Cli::TearDown();
  }
  // Two free loopback ports in a row (rank 0's and rank 1's).
  static int free_pair() {
    for (int i = 0; i < 50; ++i) {
      const int p = free_port();
      if (p < 65535 && !accepts(p + 1)) return p;
    }
    return 0;
  }
  static std::string get(int port, const std::string& key, int* status) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    const auto res = c.Get("/metrics", h);
    *status = res ? res->status : 0;
    return res ? res->body : "";
  }
  pid_t prometheus_ = 0;
};

TEST_F(MetricsServer, TwoRanksServeTheirMetricsAndPrometheusReadsTheLoss) {
  const int port = free_pair(), prom_port = free_port();
  ASSERT_GT(port, 0);
  const bool with_prometheus = fs::exists(kPrometheus);
  if (with_prometheus) {
    write(p("prometheus.yml"), cat("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: loom\n",
                                   "    authorization:\n      credentials: sesame\n    static_configs:\n      - targets: ['127.0.0.1:", port,
                                   "', '127.0.0.1:", port + 1, "']\n"));
    prometheus_ = testing::spawn({kPrometheus, cat("--config.file=", p("prometheus.yml")), cat("--storage.tsdb.path=", p("tsdb")),
                                  cat("--web.listen-address=127.0.0.1:", prom_port)},
                                 p("prometheus.out"), p("prometheus.err"));
    ASSERT_GT(prometheus_, 0);
  }
  // 2 ranks, 40 steps slowed to about 12 s, so that a 1 s scrape sees a good many of them.
  const std::string out = p("train.out");
  const pid_t launcher = launch_in_background(
      cat("-n 2 -- env LOOM_API_KEY=sesame ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
          " --quiet --training.steps=40 --checkpoint.every=20 --debug.delay_ms=0:300 --metrics.port=", port,
          " --metrics.every_rank=true --metrics.peak_gflops=50"),
      out);
  // Both ranks answer once training has begun; without the key, 401.
  std::string rank0, rank1;
  int status = 0;
  for (int i = 0; i < 400 && (rank0.find("loom_train_step{") == std::string::npos || rank1.find("loom_train_step{") == std::string::npos); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rank0 = get(port, "sesame", &status);
    rank1 = get(port + 1, "sesame", &status);
  }
  ASSERT_NE(rank0.find("loom_train_step{rank=\"0\"}"), std::string::npos) << rank0 << read_file(out);
  ASSERT_NE(rank1.find("loom_train_step{rank=\"1\"}"), std::string::npos) << rank1;
  get(port, "", &status);
  EXPECT_EQ(status, 401);
  get(port, "wrong", &status);
  EXPECT_EQ(status, 401);
  for (const char* family : {"# TYPE loom_train_loss gauge", "# HELP loom_train_tokens_per_second ", "loom_train_mfu{rank=\"0\"} ",
                             "loom_train_step_duration_seconds{rank=\"0\",part=\"compute\"} ",
                             "loom_train_step_duration_seconds{rank=\"0\",part=\"data_wait\"} ",
                             "loom_train_time_seconds_total{rank=\"0\",part=\"exposed_communication\"} ",
                             "loom_train_memory_peak_bytes{rank=\"1\",phase=\"step\"} ", "loom_train_restarts_total{rank=\"0\"} 0",
                             "loom_train_steps_lost_total{rank=\"0\"} 0", "loom_train_model_state_bytes{rank=\"0\",kind=\"optimizer\"} "})
    EXPECT_NE(rank0.find(family), std::string::npos) << family << "\n" << rank0;
  EXPECT_EQ(rank1.find("loom_train_restarts_total"), std::string::npos) << "rank 0 keeps the run's books";
  EXPECT_EQ(rank1.find("rank=\"0\""), std::string::npos) << "a rank's own series only:\n" << rank1;
  if (fs::exists(kPromtool)) {
    write(p("exposition.txt"), rank0);
    const testing::CommandResult lint = testing::run_command(cat(kPromtool, " check metrics < ", p("exposition.txt"), " 2>&1"));
    EXPECT_EQ(lint.code, 0) << lint.out;
    EXPECT_EQ(lint.out, "") << lint.out;
  }
  const auto t0 = std::chrono::system_clock::now();
  int code = testing::wait_exit(launcher);
  ASSERT_EQ(code, 0) << read_file(out);
  if (!with_prometheus) GTEST_SKIP() << kPrometheus << " is not installed (scripts/setup.sh installs it): not scraped";
  // The loss series Prometheus kept: every value one of metrics.jsonl's losses.
  std::set<double> losses;
  std::istringstream lines(read_file(p("runs/r/metrics.jsonl")));
  for (std::string l; std::getline(lines, l);) losses.insert(nlohmann::json::parse(l)["loss"].get<double>());
  const double end = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double start = end - 120 - std::chrono::duration<double>(std::chrono::system_clock::now() - t0).count();
  httplib::Client api("127.0.0.1", prom_port);
  nlohmann::json values;
  for (int i = 0; i < 40 && values.empty(); ++i) {
    const auto res = api.Get(cat("/api/v1/query_range?query=loom_train_loss&start=", static_cast<int64_t>(start), "&end=",
                                 static_cast<int64_t>(end) + 1, "&step=1"));
    if (res && res->status == 200) {
      const auto j = nlohmann::json::parse(res->body);
      for (const auto& series : j["data"]["result"])
        if (series["metric"]["rank"] == "0") values = series["values"];
    }
    if (values.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_FALSE(values.empty()) << read_file(p("prometheus.err"));
  std::set<double> seen;
  for (const auto& v : values) seen.insert(std::stod(v[1].get<std::string>()));
  EXPECT_GE(seen.size(), 3u) << "several steps scraped";
  for (double v : seen) EXPECT_TRUE(losses.contains(v)) << v << " is no step's loss";
}

TEST_F(MetricsServer, APortInUseIsOneLineAndNothingIsWritten) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int busy = ntohs(a.sin_port);
  Result r = loom(cat("train ", p("nano.toml"), " --quiet --metrics.port=", busy));
  ::close(s);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(cat("metrics.port = ", busy, ": cannot listen on 127.0.0.1:", busy)), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_FALSE(fs::exists(p("runs/r")));
  // Reachable from other hosts without a key: refused before anything starts.
  r = loom(cat("train ", p("nano.toml"), " --quiet --metrics.port=", busy, " --metrics.host=0.0.0.0"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("need an API key (LOOM_API_KEY)"), std::string::npos) << r.err;
  r = loom(cat("train ", p("nano.toml"), " --quiet --metrics.port=70000"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("expected a TCP port"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("runs/r")));
}

}  // namespace
}  // namespace loom
