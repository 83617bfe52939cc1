#include "loom/nn/step_breakdown.h"

#include <chrono>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/host.h"

namespace loom::nn {
namespace {

using Clock = std::chrono::steady_clock;

struct Recording {
  bool on = false;
  StepPartObserver observer;
  int current = -1;  // the part whose clock runs (-1: none)
  Clock::time_point since;
  double cpu_since = 0;
  std::array<double, kStepParts> seconds{}, cpu_seconds{};
};
thread_local Recording g_recording;

// Charges the running part for the time since it was last charged.
void charge(Recording& r, Clock::time_point now) {
  const double cpu = process_cpu_seconds();  // a system call: only where recording is on
  if (r.current >= 0) {
    r.seconds[static_cast<size_t>(r.current)] += std::chrono::duration<double>(now - r.since).count();
    r.cpu_seconds[static_cast<size_t>(r.current)] += cpu - r.cpu_since;
  }
  r.since = now;
  r.cpu_since = cpu;
}

}  // namespace

const char* step_part_name(StepPart part) {
  static constexpr const char* kNames[kStepParts] = {
      "linear_fwd", "linear_dx", "linear_dw", "attn_fwd",  "attn_bwd",  "norm_fwd",
      "norm_bwd",   "gelu_fwd",  "gelu_bwd",  "edges_fwd", "edges_bwd", "optimizer"};
  const int i = static_cast<int>(part);
  LOOM_CHECK(i >= 0 && i < kStepParts);
  return kNames[i];
}

void record_step_parts(bool on) {
  LOOM_CHECK(g_recording.current < 0);  // not inside a scope
  g_recording.on = on;
  g_recording.seconds = {};
  g_recording.cpu_seconds = {};
}

void observe_step_parts(StepPartObserver observer) { g_recording.observer = std::move(observer); }

std::array<double, kStepParts> take_step_parts() {
  LOOM_CHECK(g_recording.current < 0);
  const std::array<double, kStepParts> out = g_recording.seconds;
  g_recording.seconds = {};
  return out;
}

std::array<double, kStepParts> take_step_parts_cpu() {
  LOOM_CHECK(g_recording.current < 0);
  const std::array<double, kStepParts> out = g_recording.cpu_seconds;
  g_recording.cpu_seconds = {};
  return out;
}

StepPartScope::StepPartScope(StepPart part) : part_(part) {
  Recording& r = g_recording;
  if (!r.on && !r.observer) return;
  begin_ = Clock::now();
  observed_ = static_cast<bool>(r.observer);
  if (!r.on) return;
  recorded_ = true;
  charge(r, begin_);
  outer_ = r.current;
  r.current = static_cast<int>(part);
}

StepPartScope::~StepPartScope() {
  if (!recorded_ && !observed_) return;
  Recording& r = g_recording;
  const Clock::time_point end = Clock::now();
  if (recorded_) {
    charge(r, end);
    r.current = outer_;
  }
  if (observed_ && r.observer) r.observer(part_, begin_, end);
}

}  // namespace loom::nn
