#include "loom/train/debug_hooks.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>

#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"

namespace loom::train {

void install_fault_hook(const std::string& s, int rank) {
  if (s.empty()) return;
  const size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  std::string point = s.substr(0, a);
  int64_t step = -1, only = -1;
  try {
    if (a != std::string::npos) step = std::stoll(s.substr(a + 1, b == std::string::npos ? b : b - a - 1));
    if (b != std::string::npos) only = std::stoll(s.substr(b + 1));
  } catch (const std::exception&) {
    step = -1;
  }
  const std::vector<std::string> points = {"shard", "state", "index", "renamed", "latest"};
  if (step < 0 || std::find(points.begin(), points.end(), point) == points.end())
    throw InputError(cat("debug.fault_at = \"", printable(s), "\": expected POINT:STEP[:RANK], POINT one of shard, state, "
                         "index, renamed, latest"));
  if (only >= 0 && only != rank) return;
  checkpoint::set_fault_hook([point, step](std::string_view at, int64_t saving) {
    if (at == point && saving == step) ::raise(SIGKILL);
  });
}

int64_t step_delay_ms(const std::string& s, int rank) {
  if (s.empty()) return 0;
  const size_t colon = s.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument(s);
    const int64_t who = std::stoll(s.substr(0, colon)), ms = std::stoll(s.substr(colon + 1));
    if (ms < 0) throw std::invalid_argument(s);
    return who == rank ? ms : 0;
  } catch (const std::exception&) {
    throw InputError(cat("debug.delay_ms = \"", printable(s), "\": expected RANK:MS"));
  }
}

std::vector<int64_t> overflow_steps(const std::string& s) {
  if (s.empty()) return {};
  std::vector<int64_t> steps;
  for (size_t at = 0; at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    int64_t step = -1;
    try {
      size_t used = 0;
      step = std::stoll(s.substr(at, comma - at), &used);
      if (used != comma - at) step = -1;
    } catch (const std::exception&) {
    }
    if (step < 1) throw InputError(cat("debug.overflow_at = \"", printable(s), "\": expected STEP[,STEP...], each >= 1"));
    steps.push_back(step);
    at = comma + 1;
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t step_jitter_ms(int64_t ms, int rank, int64_t step) {
  if (ms <= 0) return 0;
  uint64_t h = (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(step);  // splitmix64
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h % 4 == 0 ? 4 * ms : 0;
}

}  // namespace loom::train
