// `loom plan`'s reports of the simulator's predictions (loom/parallel/schedule.h).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {
namespace {

// printf into a std::string.
[[gnu::format(printf, 1, 2)]] std::string format(const char* f, ...) {
  va_list args, size_args;
  va_start(args, f);
  va_copy(size_args, args);
  const int n = std::vsnprintf(nullptr, 0, f, size_args);
  va_end(size_args);
  std::string out(static_cast<size_t>(std::max(n, 0)), '\0');
  std::vsnprintf(out.data(), out.size() + 1, f, args);  // and its NUL where the string keeps one
  va_end(args);
  return out;
}

}  // namespace

std::string compare_schedules(int stages, int microbatches, int virtual_stages,
                              const std::function<std::vector<PipeCosts>(int v)>& costs_for) {
  std::map<int, std::vector<PipeCosts>> measured;  // by chunks per stage
  std::map<int, std::string> unmeasurable;         // ... and why a chunk count is not
  measured[1] = costs_for(1);
  const int chunks = std::max(2, virtual_stages);
  try {
    measured[chunks] = costs_for(chunks);
  } catch (const InputError& e) {
    unmeasurable[chunks] = e.what();
  }
  std::string out = format("%-12s %7s %11s %9s %9s %22s\n", "schedule", "chunks", "step (ms)", "bubble", "closed",
                           "peak activations (MiB)");
  for (auto kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved, ScheduleKind::kZeroBubble}) {
    const int v = kind == ScheduleKind::kInterleaved ? chunks : 1;
    const MicrobatchRule rule = microbatch_rule(kind, stages, v);
    if (microbatches < rule.minimum || microbatches % rule.multiple_of != 0) {
      out += format("%-12s %7d %11s  (needs a multiple of %d micro-batches, at least %d)\n", schedule_kind_name(kind), v,
                    "-", rule.multiple_of, rule.minimum);
      continue;
    }
    if (unmeasurable.count(v)) {
      out += format("%-12s %7d %11s  (%s)\n", schedule_kind_name(kind), v, "-", unmeasurable[v].c_str());
      continue;
    }
    const Simulation sim = simulate_stages(make_schedule(kind, stages, microbatches, v), measured[v]);
    double peak = 0;
    for (double m : sim.peak_activation_mb) peak = std::max(peak, m);
    out += format("%-12s %7d %11.4g %8.1f%% %8.1f%% %22.4g\n", schedule_kind_name(kind), v, sim.step_ms, 100 * sim.bubble,
                  100 * closed_form_bubble(kind, stages, microbatches, v), peak);
  }
  return out;
}

std::string describe_simulation(ScheduleKind kind, const Schedule& s, const Simulation& sim, int width) {
  std::string out = format("predicted step %.4g ms, bubble %.1f%% (closed form for uniform stages and free transfers: %.1f%%)\n",
                           sim.step_ms, 100 * sim.bubble,
                           100 * closed_form_bubble(kind, s.stages, s.microbatches, s.virtual_stages));
  for (int st = 0; st < s.stages; ++st)
    out += format("stage %d: busy %.4g ms, idle %.4g ms, peak %d chunk activation(s) in flight = %.4g MiB\n", st,
                  sim.busy_ms[st], sim.step_ms - sim.busy_ms[st], sim.peak_in_flight[st], sim.peak_activation_mb[st]);
  out += '\n';
  out += draw_text(s, sim, width);
  out += format("F forward, B backward, b input gradients, w weight gradients, then the micro-batch%s; '.' idle\n",
                s.virtual_stages > 1 ? "/chunk" : "");
  return out;
}

}  // namespace loom::parallel
