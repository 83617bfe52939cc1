#include "loom/obs/metrics.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

namespace loom::obs {
namespace {

TEST(Metrics, NumbersRoundTripExactly) {
  for (double v : {0.1, 1.0 / 3.0, 5.545177444479562, 1e-300, -2.5e10}) {
    std::string s = json_number(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  }
  EXPECT_EQ(json_number(std::numeric_limits<double>::quiet_NaN()), "null");
}

TEST(Metrics, LineKeepsKeyOrder) {
  JsonLine l;
  l.add("step", int64_t{3}).add("loss", 0.5).add_string("note", "a\"b");
  EXPECT_EQ(l.str(), R"({"step": 3, "loss": 0.5, "note": "a\"b"})");
}

}  // namespace
}  // namespace loom::obs
