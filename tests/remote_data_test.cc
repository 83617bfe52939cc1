// Remote shards through the local cache (docs/data.md, "Remote shards"), against a real HTTP
// server: Debian's nginx, started by the test on a free loopback port, serving a prepared
// dataset (and a /slow/ copy of it at 64 KiB/s). Cold and warm caches, one download per
// shard per host, a server killed in the middle of a shard (the download resumes with a
// range request; without a server, one line naming the shard and URL), a shard corrupted
// on the server (refused, nothing kept), a cache smaller than the dataset (eviction, and
// training goes on), and credentials in a URL never printed.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "cli_fixture.h"
#include "processes.h"
#include "loom/core/fileio.h"
#include "loom/data/dataset.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

constexpr const char* kNginx = "/usr/sbin/nginx";

using testing::accepts;
using testing::spawn;
using testing::wait_exit;

class Remote : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (!fs::exists(kNginx)) GTEST_SKIP() << kNginx << " is not installed (scripts/setup.sh installs nginx)";
    fs::create_directories(p("text"));
    std::string text;
    for (int i = 0; i < 6000; ++i) text += cat("Line ", i, ": the quick brown fox jumps over the lazy dog.\n");
    write(p("text/a.txt"), text);
    const Result r = loom(cat("data prepare text:", p("text"), " --out ", p("srv/ds"), " --shard-tokens 60000 --val-fraction 0"));
    ASSERT_EQ(r.code, 0) << r.err;
    port_ = free_port();
    start_nginx();
    // The manifest a user would publish: the same shards by URL.
    manifest_ = data::read_manifest(p("srv/ds/train.json"));
    write(p("remote.json"), remote_manifest(""));
    write(p("slow.json"), remote_manifest("slow/", "", 2));
  }
  void TearDown() override {
    stop_nginx();
    Cli::TearDown();
  }

  // The manifest by URL: every shard, or the first `shards`.
  std::string remote_manifest(const std::string& prefix, const std::string& credentials = "", size_t shards = 0) const {
    data::Manifest m = manifest_;
    if (shards > 0) m.shards.resize(shards);
    for (data::ShardInfo& s : m.shards) {
      s.location = cat("http://", credentials, "127.0.0.1:", port_, "/", prefix, "ds/", s.location);
      s.path.clear();
    }
    return data::manifest_json(m);
  }

  void start_nginx() {
    fs::create_directories(p("nginx/tmp"));
    write(p("nginx/nginx.conf"),
          cat("daemon off;\nmaster_process off;\nworker_processes 1;\npid ", p("nginx/nginx.pid"), ";\nerror_log ",
              p("nginx/error.log"), ";\nevents { worker_connections 64; }\nhttp {\n  access_log ", p("nginx/access.log"),
              " combined;\n  client_body_temp_path ", p("nginx/tmp"), ";\n  proxy_temp_path ", p("nginx/tmp"),
              ";\n  fastcgi_temp_path ", p("nginx/tmp"), ";\n  uwsgi_temp_path ", p("nginx/tmp"), ";\n  scgi_temp_path ",
              p("nginx/tmp"), ";\n  server {\n    listen 127.0.0.1:", port_, ";\n    root ", p("srv"),
              ";\n    location /slow/ { alias ", p("srv"), "/; limit_rate 64k; }\n  }\n}\n"));
    nginx_ = spawn({kNginx, "-e", p("nginx/error.log"), "-p", p("nginx"), "-c", p("nginx/nginx.conf")}, p("nginx/out"),
                   p("nginx/err"));
    ASSERT_GT(nginx_, 0);
    for (int i = 0; i < 200 && !accepts(port_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(accepts(port_)) << read_file(p("nginx/err")) << read_file(p("nginx/error.log"));
  }
  void stop_nginx() {
    if (nginx_ <= 0) return;
    ::kill(nginx_, SIGKILL);
    wait_exit(nginx_);
    nginx_ = 0;
  }
  // The access log's requests: each line's path and status.
  std::vector<std::pair<std::string, int>> requests() const {
    std::vector<std::pair<std::string, int>> out;
    std::istringstream in(fs::exists(p("nginx/access.log")) ? read_file(p("nginx/access.log")) : "");
    for (std::string line; std::getline(in, line);) {
      const size_t q = line.find('"'), sp = line.find(' ', q), sp2 = line.find(' ', sp + 1), end = line.find('"', q + 1);
      out.emplace_back(line.substr(sp + 1, sp2 - sp - 1), std::stoi(line.substr(end + 2, 3)));
    }
    return out;
  }
  int64_t cached_bytes(const std::string& dir) const {
    int64_t n = 0;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".bin") n += static_cast<int64_t>(e.file_size());
    return n;
  }

  int port_ = 0;
  pid_t nginx_ = 0;
  data::Manifest manifest_;
};

TEST_F(Remote, ColdThenWarmWithOneDownloadPerShardPerHost) {
  const std::string train = cat("train ", p("nano.toml"), " --quiet --data.train=", p("remote.json"),
                                " --data.val= --data.cache_dir=", p("cache"), " --training.steps=4 --training.eval_every=0");
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom ", train, " --job.name=cold"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto cold = requests();
  ASSERT_FALSE(cold.empty());
  std::map<std::string, int> per_url;
  for (const auto& [url, status] : cold) {
    EXPECT_EQ(status, 200) << url;
    ++per_url[url];
  }
  for (const auto& [url, n] : per_url) EXPECT_EQ(n, 1) << url << ": two local ranks, one download";
  EXPECT_EQ(cached_bytes(p("cache")), [&] {
    int64_t n = 0;
    for (const auto& s : manifest_.shards)
      if (per_url.contains(cat("/ds/", s.location))) n += s.bytes();
    return n;
  }());
  // Warm: the same shards from the cache, no request.
  r = loom(train + " --job.name=warm");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(requests().size(), cold.size());
  // `loom data fetch` fills the cache with the rest and the shards' document indexes; then
  // every shard and index is there, and document windows train without a request.
  r = loom(cat("data fetch ", p("remote.json"), " --cache-dir ", p("cache")));
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, int64_t> files;  // by content: shards with one document share one index
  for (const auto& s : manifest_.shards) {
    files[s.sha256] = s.bytes();
    files[s.index_sha256] = s.index().bytes();
  }
  int64_t all = 0;
  for (const auto& [sha, bytes] : files) all += bytes;
  EXPECT_EQ(cached_bytes(p("cache")), all);
  const size_t fetched = requests().size();
  r = loom(train + " --job.name=documents --data.windows=documents");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(requests().size(), fetched);
}

TEST_F(Remote, AServerKilledMidShardIsResumedOrNamed) {
  // Shards at 64 KiB/s: each takes a while; the server dies in the middle of one and comes
  // back: the download goes on from where it stopped (a 206 in the log).
  const pid_t fetch = spawn({cat(LOOM_BINARY_DIR, "/loom"), "data", "fetch", p("slow.json"), "--cache-dir", p("c2")},
                            p("fetch.out"), p("fetch.err"));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  stop_nginx();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  start_nginx();
  EXPECT_EQ(wait_exit(fetch), 0) << read_file(p("fetch.err"));
  bool resumed = false;
  for (const auto& [url, status] : requests()) resumed = resumed || status == 206;
  EXPECT_TRUE(resumed) << read_file(p("nginx/access.log"));
  EXPECT_NE(read_file(p("fetch.err")).find("trying again"), std::string::npos) << read_file(p("fetch.err"));
  for (size_t s = 0; s < 2; ++s) EXPECT_TRUE(fs::exists(p(cat("c2/", manifest_.shards[s].sha256, ".bin"))));

  // No server at all, credentials in the URL: one line naming the shard and its URL, the
  // password nowhere.
  stop_nginx();
  write(p("secret.json"), remote_manifest("", "reader:secretpw@"));
  const Result r = loom(cat("data fetch ", p("secret.json"), " --cache-dir ", p("c3"), " --retries 1"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(cat("loom: error: shard http://***@127.0.0.1:", port_, "/ds/train-000000.bin")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("could not download it in 2 attempts"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("secretpw"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("secretpw"), std::string::npos) << r.out;
}

TEST_F(Remote, AShardCorruptedOnTheServerIsRefusedAndNotKept) {
  {
    std::fstream f(p("srv/ds/train-000001.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3000);
    f.put('!');
  }
  const Result r = loom(cat("data fetch ", p("remote.json"), " --cache-dir ", p("c4")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("train-000001.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the server's shard is not the one listed; nothing of it is kept"), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(p("c4")))
    EXPECT_FALSE(e.path().filename().string().starts_with(manifest_.shards[1].sha256 + ".bin")) << e.path();
}

TEST_F(Remote, ACacheOnAFullDiskIsNamed) {
  fs::create_directories(p("full"));
  if (testing::run_command(cat("mount -t tmpfs -o size=64k tmpfs ", p("full"), " 2>&1")).code != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    std::string at;
    ~Unmount() { testing::run_command(cat("umount ", at)); }
  } unmount{p("full")};
  const Result r = loom(cat("data fetch ", p("remote.json"), " --cache-dir ", p("full")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(cat("loom: error: the shard cache ", p("full"), " has ")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train-000000.bin"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(Remote, ACacheSmallerThanTheDatasetEvictsAndTrainingGoesOn) {
  ASSERT_GE(manifest_.shards.size(), 4u);
  const int64_t shard = manifest_.shards[0].bytes();
  const double cache_mb = 2.5 * static_cast<double>(shard) / (1 << 20);  // room for two shards
  const Result r = loom(cat("train ", p("nano.toml"), " --quiet --data.train=", p("remote.json"), " --data.val= --data.cache_dir=",
                            p("c5"), " --data.cache_mb=", cache_mb, " --training.steps=6 --training.eval_every=0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_LE(cached_bytes(p("c5")), static_cast<int64_t>(cache_mb * (1 << 20)));
  std::map<std::string, int> per_url;
  for (const auto& [url, status] : requests()) ++per_url[url];
  int again = 0;
  for (const auto& [url, n] : per_url) again += n > 1;
  EXPECT_GT(again, 0) << "a shard evicted and needed again is fetched again";
}

}  // namespace
}  // namespace loom
