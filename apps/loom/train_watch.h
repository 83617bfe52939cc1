// What a training run watches and reports beside its steps: the test hooks that crash or slow
// a rank on demand, rank 0's straggler watch, the flight recorder dumped after a failure,
// the process's peak memory (docs/launch.md, "Stragglers", "Flight recorder";
// docs/formats.md, "Crash safety").
// Thread-safety: for the training thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm.h"
#include "loom/params.h"

namespace loom::app {

// The [debug] keys (docs/config.md): failures and slowness on demand, for the tests and
// benchmarks that need them. Each is off when empty (0).
//
// debug.fault_at = "POINT:STEP[:RANK]" (docs/formats.md "Crash safety"): this process
// SIGKILLs itself at that point of the save of that step (on that rank; default every rank).
// InputError naming the key when malformed.
void install_fault_hook(const std::string& fault_at, int rank);

// debug.delay_ms = "RANK:MS": that rank sleeps MS ms in every step's compute, a straggler
// on demand. 0 for every other rank.
int64_t step_delay_ms(const std::string& delay_ms, int rank);

// debug.overflow_at = "STEP[,STEP...]" (docs/numerics.md "Mixed precision"): in those steps
// (1-based, as metrics.jsonl counts them) backward runs on the loss times 2^40 on top of
// fp16's loss scale, so its gradients overflow as a diverging step's would.
std::vector<int64_t> overflow_steps(const std::string& overflow_at);

// debug.jitter_ms = MS (benchmarks): every rank stalls now and then, MS per step on
// average: 4 x MS in a quarter of its steps, chosen by a hash of (rank, step), else not at
// all.
int64_t step_jitter_ms(int64_t jitter_ms, int rank, int64_t step);

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


// The flight recorder of each of this rank's communicators, written to
// RUN/logs/flight-rank<R>.json after a failure (docs/launch.md, "Flight recorder"). Returns
// the path, or "" when it could not be written (the failure is what gets reported).
std::string dump_flight_record(const std::string& run, int rank, int64_t step, const std::string& error,
                               const std::vector<std::pair<std::string, const comm::Communicator*>>& comms);

// [training] keep_zeros (docs/serving.md, "Pruning"): which elements of this rank's
// weights and biases (ParamKind kWeight, kBias) are exactly zero, one byte each; and
// zeroing them again after an update.
std::vector<uint8_t> zero_mask(const ParamSet& params);
void apply_zero_mask(const ParamSet& params, const std::vector<uint8_t>& mask);

// The process's peak resident memory so far, MiB.
double peak_rss_mb();

}  // namespace loom::app
