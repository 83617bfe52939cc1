#include "loom/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace loom {
namespace {

TEST(Rng, DeterministicAndStreamsDiffer) {
  Rng a(42), b(42), c(42, 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(Rng(42).next_u64(), c.next_u64());
}

TEST(Rng, StateRestoresSequence) {
  Rng a(7);
  a.normal();
  auto s = a.state();
  double x = a.normal();
  Rng b(0);
  b.set_state(s);
  EXPECT_EQ(b.normal(), x);
}

TEST(Rng, MomentsAreRight) {
  Rng r(1);
  const int n = 200000;
  double sum = 0, sq = 0, usum = 0;
  for (int i = 0; i < n; ++i) {
    double z = r.normal();
    sum += z;
    sq += z * z;
    usum += r.uniform();
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);   // 4.5 sigma of the mean
  EXPECT_NEAR(sq / n, 1.0, 0.015);
  EXPECT_NEAR(usum / n, 0.5, 0.003);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(r.below(7), 7u);
}

}  // namespace
}  // namespace loom
