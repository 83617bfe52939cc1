#include "loom/obs/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::obs {
namespace {

TEST(Trace, MergedFileIsChromeTraceJsonWithOneProcessPerRank) {
  const auto t0 = Trace::Clock::now();
  std::vector<std::string> ranks;
  for (int r = 0; r < 2; ++r) {
    Trace t(t0);
    t.span(Trace::kTraining, "block \"0\" forward", t0 + std::chrono::microseconds(10), t0 + std::chrono::microseconds(35));
    t.span(Trace::kComm, "all-reduce", t0 + std::chrono::microseconds(20), t0 + std::chrono::microseconds(30),
           {{"bytes", "4096"}});
    EXPECT_EQ(t.size(), 2u);
    ranks.push_back(t.events(r));
  }
  const auto j = nlohmann::json::parse(merge_traces(ranks));
  int spans = 0;
  std::set<int> pids;
  for (const auto& e : j.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M") continue;
    ++spans;
    if (e.at("tid") == Trace::kComm) {
      EXPECT_EQ(e.at("args").at("bytes"), 4096);
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 20.0);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 10.0);
    } else {
      EXPECT_EQ(e.at("name"), "block \"0\" forward");
    }
  }
  EXPECT_EQ(spans, 4);
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
}

TEST(Trace, StepListsParse) {
  EXPECT_EQ(parse_steps(""), (std::vector<int64_t>{}));
  EXPECT_EQ(parse_steps("3"), (std::vector<int64_t>{3}));
  EXPECT_EQ(parse_steps("7,2-4,3"), (std::vector<int64_t>{2, 3, 4, 7}));
  for (const char* bad : {"0", "x", "3,", "4-2", "-3", "1-", "2.5", "1,,2"}) EXPECT_THROW(parse_steps(bad), InputError) << bad;
}

}  // namespace
}  // namespace loom::obs
