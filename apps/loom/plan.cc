// `loom plan`: evaluates pipeline schedules with the simulator (loom/schedule.h) and
// prints the predicted step time, bubble and activation memory per stage, with a timeline.
#include <cstdio>

#include "commands.h"
#include "loom/error.h"
#include "loom/fileio.h"
#include "loom/schedule.h"

namespace loom::app {

namespace {

void check_costs(const PlanArgs& a) {
  const std::pair<const char*, double> costs[] = {
      {"--forward-ms", a.forward_ms},       {"--backward-ms", a.backward_ms},
      {"--backward-input-ms", a.backward_input_ms}, {"--backward-weight-ms", a.backward_weight_ms},
      {"--transfer-ms", a.transfer_ms},     {"--activation-mb", a.activation_mb}};
  for (const auto& [flag, v] : costs)
    if (!(v >= 0)) throw InputError(cat(flag, " = ", v, ": expected >= 0"));
  if (!(a.forward_ms + a.backward_ms > 0)) throw InputError("--forward-ms and --backward-ms: expected a positive step");
  if (a.width < 10) throw InputError(cat("--width = ", a.width, ": expected >= 10"));
}

// One line per schedule: the numbers to pick a schedule by.
int compare_all(const PlanArgs& a, const parallel::PipeCosts& costs) {
  std::printf("%d stages, %d micro-batches; per stage: forward %g ms, backward %g ms, transfer %g ms\n", a.pp,
              a.microbatches, a.forward_ms, a.backward_ms, a.transfer_ms);
  std::printf("%-12s %7s %11s %9s %9s %22s\n", "schedule", "chunks", "step (ms)", "bubble", "closed", "peak activations (MiB)");
  for (auto kind : {parallel::ScheduleKind::kGpipe, parallel::ScheduleKind::kOneFOneB, parallel::ScheduleKind::kInterleaved,
                    parallel::ScheduleKind::kZeroBubble}) {
    const int v = kind == parallel::ScheduleKind::kInterleaved ? std::max(2, a.virtual_stages) : 1;
    const auto rule = parallel::microbatch_rule(kind, a.pp, v);
    if (a.microbatches < rule.minimum || a.microbatches % rule.multiple_of != 0) {
      std::printf("%-12s %7d %11s  (needs a multiple of %d micro-batches, at least %d)\n",
                  parallel::schedule_kind_name(kind), v, "-", rule.multiple_of, rule.minimum);
      continue;
    }
    const parallel::Schedule s = parallel::make_schedule(kind, a.pp, a.microbatches, v);
    const parallel::Simulation sim = parallel::simulate(s, costs);
    double peak = 0;
    for (double m : sim.peak_activation_mb) peak = std::max(peak, m);
    std::printf("%-12s %7d %11.4g %8.1f%% %8.1f%% %22.4g\n", parallel::schedule_kind_name(kind), v, sim.step_ms,
                100 * sim.bubble, 100 * parallel::closed_form_bubble(kind, a.pp, a.microbatches, v), peak);
  }
  return 0;
}

}  // namespace

int run_plan(const PlanArgs& a) {
  check_costs(a);
  if (a.pp < 1) throw InputError(cat("--pp = ", a.pp, ": expected >= 1"));
  const parallel::PipeCosts costs{.forward_ms = a.forward_ms, .backward_ms = a.backward_ms,
                                  .backward_input_ms = a.backward_input_ms, .backward_weight_ms = a.backward_weight_ms,
                                  .transfer_ms = a.transfer_ms, .activation_mb = a.activation_mb};
  if (a.schedule == "all") {
    if (!a.svg.empty()) throw InputError("--svg draws one schedule; pick it with --schedule");
    return compare_all(a, costs);
  }
  const parallel::ScheduleKind kind = parallel::schedule_kind_named(a.schedule);
  const parallel::Schedule s = parallel::make_schedule(kind, a.pp, a.microbatches, a.virtual_stages);
  const parallel::Simulation sim = parallel::simulate(s, costs);
  std::printf("schedule %s: %d stage(s) x %d chunk(s), %d micro-batches; per stage: forward %g ms, backward %g ms, "
              "transfer %g ms\n",
              a.schedule.c_str(), a.pp, a.virtual_stages, a.microbatches, a.forward_ms, a.backward_ms, a.transfer_ms);
  std::printf("predicted step %.4g ms, bubble %.1f%% (closed form for uniform stages and free transfers: %.1f%%)\n",
              sim.step_ms, 100 * sim.bubble, 100 * parallel::closed_form_bubble(kind, a.pp, a.microbatches, a.virtual_stages));
  for (int st = 0; st < a.pp; ++st)
    std::printf("stage %d: busy %.4g ms, idle %.4g ms, peak %d chunk activation(s) in flight = %.4g MiB\n", st,
                sim.busy_ms[st], sim.step_ms - sim.busy_ms[st], sim.peak_in_flight[st], sim.peak_activation_mb[st]);
  std::printf("\n%s", parallel::draw_text(s, sim, a.width).c_str());
  std::printf("F forward, B backward, b input gradients, w weight gradients, then the micro-batch%s; '.' idle\n",
              a.virtual_stages > 1 ? "/chunk" : "");
  if (!a.svg.empty()) {
    const std::string title = cat(a.schedule, ": ", a.pp, " stages, ", a.microbatches, " micro-batches",
                                  a.virtual_stages > 1 ? cat(", ", a.virtual_stages, " chunks per stage") : std::string());
    write_file_atomic(a.svg, parallel::draw_svg(s, sim, title));
    std::printf("picture: %s\n", a.svg.c_str());
  }
  return 0;
}

}  // namespace loom::app
