// obs::StragglerWatch (docs/launch.md, "Stragglers"): a rank is named once it has been over
// 3x the median and more than the noise margin over it for 3 steps in a row, once per streak.
#include "loom/obs/straggler.h"

#include <gtest/gtest.h>

namespace loom::obs {
namespace {

TEST(StragglerWatch, NamesARankSlowForThreeStepsOncePerStreak) {
  StragglerWatch watch(4);
  double median = 0;
  const std::vector<double> even = {10, 11, 10, 12}, one_slow = {10, 11, 100, 12};
  EXPECT_TRUE(watch.update(even, &median).empty());
  EXPECT_EQ(median, 10);
  EXPECT_TRUE(watch.update(one_slow, &median).empty());
  EXPECT_TRUE(watch.update(one_slow, &median).empty());
  EXPECT_EQ(watch.update(one_slow, &median), std::vector<int>{2}) << "the third slow step in a row names it";
  EXPECT_TRUE(watch.update(one_slow, &median).empty()) << "named once per streak";
  EXPECT_TRUE(watch.update(even, &median).empty());
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(watch.update(one_slow, &median).empty());
  EXPECT_EQ(watch.update(one_slow, &median), std::vector<int>{2}) << "a new streak names it again";
}

TEST(StragglerWatch, ScheduleNoiseOnFastStepsIsNotAStraggler) {
  // 3x the median but within the noise margin: a loaded machine's time slices, not a straggler.
  StragglerWatch watch(2);
  double median = 0;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(watch.update({2.5, 7.9}, &median).empty());
}

}  // namespace
}  // namespace loom::obs
