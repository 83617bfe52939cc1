// OpenBLAS opens on first use (core/openblas.h): not mapped into the process before,
// mapped after, with Loom's thread count, and its sgemm computes. core_test does not link it.
#include "core/openblas.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "loom/core/threads.h"

namespace loom {
namespace {

bool openblas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream s;
  s << maps.rdbuf();
  return s.str().find("libopenblas") != std::string::npos;
}

TEST(OpenBlas, OpensOnFirstUseWithLoomsThreads) {
  ASSERT_FALSE(openblas_opened());
  ASSERT_FALSE(openblas_mapped()) << "OpenBLAS is mapped before anything asked for it";
  set_compute_threads(2);  // before it opens: applied when it does
  const OpenBlas& b = openblas();
  EXPECT_TRUE(openblas_opened());
  EXPECT_TRUE(openblas_mapped());
  EXPECT_NE(std::string(b.corename()), "");
  const float a[4] = {1, 2, 3, 4}, x[4] = {5, 6, 7, 8};
  float c[4] = {};
  b.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, x, 2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 19.0f);
  EXPECT_EQ(c[1], 22.0f);
  EXPECT_EQ(c[2], 43.0f);
  EXPECT_EQ(c[3], 50.0f);
  set_compute_threads(1);  // once open, set directly
}

}  // namespace
}  // namespace loom
