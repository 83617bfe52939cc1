// The pipeline simulator (loom/schedule.h): runs the stages' lists against per-action
// costs, as the executor runs them against the model.
#include <algorithm>
#include <map>
#include <tuple>

#include "loom/error.h"
#include "loom/schedule.h"

namespace loom::parallel {

namespace {

double compute_cost(const PipeCosts& c, PipeOp op, int v) {
  const double bi = c.backward_input_ms > 0 ? c.backward_input_ms : c.backward_ms / 2;
  const double bw = c.backward_weight_ms > 0 ? c.backward_weight_ms : c.backward_ms / 2;
  switch (op) {
    case PipeOp::kForward: return c.forward_ms / v;
    case PipeOp::kBackward: return c.backward_ms / v;
    case PipeOp::kBackwardInput: return bi / v;
    case PipeOp::kBackwardWeight: return bw / v;
    default: return 0;
  }
}

}  // namespace

Simulation simulate(const Schedule& s, const PipeCosts& costs) {
  return simulate_stages(s, std::vector<PipeCosts>(static_cast<size_t>(s.stages), costs));
}

Simulation simulate_stages(const Schedule& s, const std::vector<PipeCosts>& per_stage, const PipeActionTimes* replay) {
  LOOM_CHECK_EQ(per_stage.size(), static_cast<size_t>(s.stages));
  if (std::string problem = check_schedule(s); !problem.empty()) throw RuntimeError("pipeline schedule: " + problem);
  if (replay) {
    LOOM_CHECK_EQ(replay->compute_ms.size(), static_cast<size_t>(s.stages));
    LOOM_CHECK_EQ(replay->overhead_ms.size(), static_cast<size_t>(s.stages));
    for (int st = 0; st < s.stages; ++st) {
      LOOM_CHECK_EQ(replay->compute_ms[st].size(), s.actions[st].size());
      LOOM_CHECK_EQ(replay->overhead_ms[st].size(), s.actions[st].size());
    }
    LOOM_CHECK(replay->start_ms.empty() || replay->start_ms.size() == static_cast<size_t>(s.stages));
  }
  const int p = s.stages, v = s.virtual_stages;
  Simulation sim;
  sim.busy_ms.assign(p, 0);
  sim.peak_in_flight.assign(p, 0);
  const std::vector<double> start = replay && !replay->start_ms.empty() ? replay->start_ms : std::vector<double>(p, 0.0);
  std::vector<double> now = start;
  std::vector<size_t> next(p, 0);
  std::vector<int> in_flight(p, 0);
  // When each message arrives: (activation?, micro-batch, receiving virtual stage).
  std::map<std::tuple<bool, int, int>, double> arrival;
  size_t remaining = 0;
  for (const auto& list : s.actions) remaining += list.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.actions[st];
      while (next[st] < list.size()) {
        const PipeAction& a = list[next[st]];
        const int vs = s.virtual_stage(st, a.chunk);
        if (a.op == PipeOp::kRecvActivation || a.op == PipeOp::kRecvGrad) {
          auto it = arrival.find({a.op == PipeOp::kRecvActivation, a.microbatch, vs});
          if (it == arrival.end()) break;  // blocked until the sender gets there
          if (it->second > now[st]) {
            sim.timeline.push_back({st, a, now[st], it->second});
            now[st] = it->second;
          }
        } else if (a.op == PipeOp::kSendActivation) {
          arrival[{true, a.microbatch, vs + 1}] = now[st] + per_stage[st].transfer_ms;
        } else if (a.op == PipeOp::kSendGrad) {
          arrival[{false, a.microbatch, vs - 1}] = now[st] + per_stage[st].transfer_ms;
        } else {
          const double d = replay ? replay->compute_ms[st][next[st]] : compute_cost(per_stage[st], a.op, v);
          sim.timeline.push_back({st, a, now[st], now[st] + d});
          now[st] += d;
          sim.busy_ms[st] += d;
          // A chunk's activations live from its forward until its last backward pass.
          if (a.op == PipeOp::kForward) ++in_flight[st];
          if (a.op == PipeOp::kBackward || a.op == PipeOp::kBackwardWeight) --in_flight[st];
          sim.peak_in_flight[st] = std::max(sim.peak_in_flight[st], in_flight[st]);
        }
        now[st] += replay ? replay->overhead_ms[st][next[st]] : per_stage[st].overhead_ms;
        ++next[st];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string waits;
      for (int st = 0; st < p; ++st)
        if (next[st] < s.actions[st].size()) {
          const PipeAction& a = s.actions[st][next[st]];
          waits += cat(waits.empty() ? "" : "; ", "stage ", st, " waits in ", pipe_op_name(a.op), " of micro-batch ",
                       a.microbatch, " chunk ", a.chunk);
        }
      throw RuntimeError(cat("pipeline schedule ", schedule_kind_name(s.kind), " deadlocks: ", waits));
    }
  }
  for (int st = 0; st < p; ++st) sim.step_ms = std::max(sim.step_ms, now[st] - start[st]);
  double busy = 0;
  for (double b : sim.busy_ms) busy += b;
  sim.bubble = sim.step_ms > 0 ? 1.0 - busy / (p * sim.step_ms) : 0.0;
  for (int st = 0; st < p; ++st) sim.peak_activation_mb.push_back(sim.peak_in_flight[st] * per_stage[st].activation_mb / v);
  std::stable_sort(sim.timeline.begin(), sim.timeline.end(),
                   [](const SimulatedAction& a, const SimulatedAction& b) { return a.end_ms < b.end_ms; });
  return sim;
}

}  // namespace loom::parallel
