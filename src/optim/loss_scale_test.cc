// fp16's dynamic loss scale (loom/optim/loss_scale.h): halves on overflow, doubles after a window
// of clean steps, stays within [min, max], refuses a checkpoint's impossible scale.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/optim/loss_scale.h"

namespace loom::optim {
namespace {

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterAWindow) {
  LossScaler s({.init = 1024, .window = 3, .min = 256, .max = 2048});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));  // the third clean step in a row
  EXPECT_EQ(s.scale(), 2048);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 2048) << "max";
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(true));  // an overflow restarts the count
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.clean_steps(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_FALSE(s.update(true)) << "below min";
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, RestoresACheckpointsScale) {
  LossScaler s;
  s.restore(4096, 17);
  EXPECT_EQ(s.scale(), 4096);
  EXPECT_EQ(s.clean_steps(), 17);
  EXPECT_THROW(s.restore(3000, 0), InputError);
  EXPECT_THROW(s.restore(0.5, 0), InputError);
  EXPECT_THROW(s.restore(4096, -1), InputError);
  EXPECT_TRUE(is_power_of_two(65536) && is_power_of_two(0.25) && !is_power_of_two(3) && !is_power_of_two(0));
}

}  // namespace
}  // namespace loom::optim
