// Issue 2, item 5c: the MLP reaches >= 85% Fashion-MNIST test accuracy with configs/mlp.toml
// (3 epochs; about 10 s on 2 cores, far inside the 2-minute budget). The time itself is a
// benchmark figure (docs/perf.md), not asserted here.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "loom_testing.h"

namespace {

TEST(MlpFashionMnist, ReachesEightyFivePercent) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  const std::string run = std::filesystem::temp_directory_path() / ("loom_mlp_" + std::to_string(::getpid()));
  const std::string cmd = std::string(LOOM_BINARY_DIR) + "/loom train " + LOOM_SOURCE_DIR +
                          "/configs/mlp.toml --quiet --job.threads=2 --job.run_dir=" + run + " 2>&1";
  auto [code, out] = loom::testing::run_command(cmd);
  EXPECT_EQ(code, 0) << out;
  std::filesystem::remove_all(run);
  auto at = out.find("test accuracy ");
  ASSERT_NE(at, std::string::npos) << out;
  const double acc = std::stod(out.substr(at + 14));
  EXPECT_GE(acc, 0.85) << out;
}

}  // namespace
