// One collective a parallel component ran, for traces (data, tensor and pipeline
// parallelism report theirs through an observer of this type).
// Thread-safety: a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace loom::parallel {

// One collective of this rank: the progress thread ran it over [begin, end); the training
// thread blocked on it over [wait_begin, wait_end) (empty when it did not).
struct CommSpan {
  std::string what;
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point begin, end, wait_begin, wait_end;
};

}  // namespace loom::parallel
