// Helpers shared by Loom's tests: a per-test temporary directory, an InputError matcher, and
// the relative-error measure the numeric tests use.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/tensor.h"

namespace loom::testing {

struct CommandResult {
  int code = 0;  // exit status, or 128 + signal
  std::string out;
};

// Runs a shell command, capturing its standard output.
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* f = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int status = ::pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The interpreter that runs the repository's standard-library-only Python tools, with its
// site packages off (`-S`): whatever else that machine's python3 has installed, a tool
// that runs here uses nothing but the standard library.
inline constexpr const char* kPython = "/usr/bin/python3 -S";

// Why kPython cannot run those tools (absent, or older than the 3.8 they are written for),
// or "" when it can. A test that needs it skips with this reason.
inline std::string python_unusable() {
  const CommandResult r = run_command(
      std::string(kPython) + " -c 'import sys, json, struct, array; assert sys.version_info >= (3, 8)' 2>&1");
  if (r.code == 0) return "";
  return "/usr/bin/python3 cannot run the standard-library tools (needs Python 3.8 or newer): exit " +
         std::to_string(r.code) + " " + r.out;
}

// The most resident memory this process has held so far, in bytes (getrusage).
inline int64_t peak_rss_bytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// Expects f() to throw InputError whose message contains every fragment.
template <typename F>
void expect_input_error(F f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
  }
}

// max |got - want| / max |want|: relative to the tensor's scale, so entries near zero do
// not make a check meaningless.
template <typename A>
double rel_err(const std::vector<A>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double scale = 1e-30, err = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  return err / scale;
}

// Structured bytes (a few repeated phrases with noise) so that a GPT's loss falls: the
// training data of the parity tests. The same `count` tokens on every call.
inline std::vector<uint16_t> phrase_tokens(size_t count) {
  std::vector<uint16_t> v;
  Rng rng(7, 3);
  const char* phrases[] = {"the quick brown fox ", "jumps over the lazy dog. ", "loom trains models; ", "all ranks agree. "};
  while (v.size() < count) {
    for (const char* c = phrases[rng.next_u64() % 4]; *c; ++c) v.push_back(static_cast<uint8_t>(*c));
    if (rng.next_u64() % 5 == 0) v.push_back(static_cast<uint16_t>(rng.next_u64() % 256));
  }
  return v;
}

// Random next-token data for a GPT: (B, T) i32 tokens and targets below `vocab`, drawn in
// turn (token i, then target i) from Rng(seed).
inline std::pair<Tensor, Tensor> random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Tensor tokens = Tensor::zeros({b, t}, DType::kI32), targets = Tensor::zeros({b, t}, DType::kI32);
  Rng r(seed);
  for (int64_t i = 0; i < b * t; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(r.below(static_cast<uint64_t>(vocab)));
    targets.data<int32_t>()[i] = static_cast<int32_t>(r.below(static_cast<uint64_t>(vocab)));
  }
  return {tokens, targets};
}

}  // namespace loom::testing
