// Rank 0's watch for stragglers (docs/launch.md, "Stragglers"): which ranks of a job have
// been much slower than the others for several steps in a row.
// Thread-safety: one thread (rank 0's training thread) uses a watch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace loom::obs {

// Rank 0's watch for stragglers (docs/launch.md, "Stragglers"): a rank whose compute time
// (its step less the time it waited for others) is over 3x the (lower) median of every
// rank's, and over it by more than kNoiseMs, for 3 steps in a row is named in a warning,
// once per streak; it is not stopped.
class StragglerWatch {
 public:
  explicit StragglerWatch(int ranks) : streak_(static_cast<size_t>(ranks), 0) {}
  // Each rank's compute ms of this step; the ranks that just became stragglers.
  // What a loaded machine's scheduler takes from a rank's step now and then: a few time
  // slices of other processes (a rank of 2.5 ms steps measured 7.9 ms for 3 steps in a row
  // while two other jobs shared its 2 cores). A straggler is one that costs more than that.
  static constexpr double kNoiseMs = 20;
  std::vector<int> update(const std::vector<double>& busy_ms, double* median_out) {
    std::vector<double> sorted = busy_ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[(sorted.size() - 1) / 2];
    *median_out = median;
    std::vector<int> named;
    for (size_t r = 0; r < busy_ms.size(); ++r) {
      streak_[r] = busy_ms[r] > 3 * median && busy_ms[r] - median > kNoiseMs ? streak_[r] + 1 : 0;
      if (streak_[r] == 3) named.push_back(static_cast<int>(r));
    }
    return named;
  }

 private:
  std::vector<int> streak_;
};

}  // namespace loom::obs
