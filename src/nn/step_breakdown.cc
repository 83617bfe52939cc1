#include "loom/nn/step_breakdown.h"

#include <chrono>

#include "loom/core/error.h"

namespace loom::nn {
namespace {

using Clock = std::chrono::steady_clock;

struct Recording {
  bool on = false;
  int current = -1;  // the part whose clock runs (-1: none)
  Clock::time_point since;
  std::array<double, kStepParts> seconds{};
};
thread_local Recording g_recording;

// Charges the running part for the time since it was last charged.
void charge(Recording& r, Clock::time_point now) {
  if (r.current >= 0) r.seconds[static_cast<size_t>(r.current)] += std::chrono::duration<double>(now - r.since).count();
  r.since = now;
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
  g_recording = Recording{};
  g_recording.on = on;
}

std::array<double, kStepParts> take_step_parts() {
  LOOM_CHECK(g_recording.current < 0);
  const std::array<double, kStepParts> out = g_recording.seconds;
  g_recording.seconds = {};
  return out;
}

StepPartScope::StepPartScope(StepPart part) {
  Recording& r = g_recording;
  if (!r.on) {
    outer_ = -2;
    return;
  }
  charge(r, Clock::now());
  outer_ = r.current;
  r.current = static_cast<int>(part);
}

StepPartScope::~StepPartScope() {
  if (outer_ == -2) return;
  Recording& r = g_recording;
  charge(r, Clock::now());
  r.current = outer_;
}

}  // namespace loom::nn
