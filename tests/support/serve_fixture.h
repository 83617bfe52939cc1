// `loom serve` as a user meets it, for the serve tests: a server process on loopback
// (`loom serve ... --port 0`, its port read off its first line) and an HTTP client.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_fixture.h"

extern char** environ;

namespace loom {

using nlohmann::json;

class Serve : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    // The server closes a connection whose body it refuses before reading it: a client
    // still writing then gets EPIPE, which must not end the test.
    ::signal(SIGPIPE, SIG_IGN);
    ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=20 --job.name=n")).code, 0);
  }
  void TearDown() override {
    stop();
    Cli::TearDown();
  }

  // Starts `loom serve ARGS --port 0` and waits for the line naming its port.
  void start(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {cat(LOOM_BINARY_DIR, "/loom"), "serve", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, p("serve.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, p("serve.err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(posix_spawn(&pid_, raw[0], &files, nullptr, raw.data(), environ), 0);
    posix_spawn_file_actions_destroy(&files);
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      const std::string out = read_file(p("serve.out"));
      if (const size_t at = out.find("127.0.0.1:"); at != std::string::npos) port_ = std::stoi(out.substr(at + 10));
    }
    ASSERT_GT(port_, 0) << read_file(p("serve.err"));
  }
  // SIGTERM, and the server must exit cleanly within a minute (else it is killed and the
  // test fails saying so, rather than waiting out ctest's timeout without a word).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 3000 && !exited; ++i) {
      exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
      if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      ADD_FAILURE() << "loom serve did not exit within 60 s of SIGTERM\n" << read_file(p("serve.err"));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << read_file(p("serve.err"));
    pid_ = 0;
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }
  // POST /v1/completions: status and parsed body.
  std::pair<int, json> complete(const json& body, const httplib::Headers& headers = {}) const {
    auto r = client().Post("/v1/completions", headers, body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  pid_t pid_ = 0;
  int port_ = 0;
};

}  // namespace loom
