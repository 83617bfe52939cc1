// A Chrome-trace (Perfetto) recorder for one rank, and the merge of every rank's events
// into one file per run (docs/formats.md, "trace.json").
//
// Each rank records complete spans ("ph": "X") on a few named tracks; timestamps are
// microseconds from an origin every rank takes right after a barrier, so the ranks' spans
// line up (to the barrier's exit skew, microseconds on one host). In the merged file each
// rank is a process ("rank R") and each track a thread, so Perfetto shows the ranks one
// above the other. Spans on one track must nest (a span inside another is drawn below it).
//
// Thread-safety: one thread records into a Trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::obs {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  enum Track : int { kTraining = 0, kComm = 1 };

  explicit Trace(Clock::time_point origin) : origin_(origin) {}

  // `args`: pairs of key and (already JSON) value, e.g. {"bytes", "4096"}.
  void span(Track track, const std::string& name, Clock::time_point begin, Clock::time_point end,
            const std::vector<std::pair<std::string, std::string>>& args = {});
  size_t size() const { return events_.size(); }

  // This rank's events, comma-separated JSON objects with pid = rank, and the metadata
  // naming its process and tracks.
  std::string events(int rank) const;

 private:
  Clock::time_point origin_;
  std::vector<std::string> events_;  // without pid
};

// {"traceEvents": [every rank's events], "displayTimeUnit": "ms"}.
std::string merge_traces(const std::vector<std::string>& per_rank_events);

// "3", "3,7", "2-4", "1-2,9": 1-based steps, ascending, without repeats. Throws
// InputError saying what is expected (the caller names the key).
std::vector<int64_t> parse_steps(const std::string& spec);

}  // namespace loom::obs
