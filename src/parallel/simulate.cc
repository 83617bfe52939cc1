// The pipeline simulator (loom/parallel/schedule.h): runs the stages' lists against per-action
// costs, as the executor runs them against the model.
#include <algorithm>
#include <map>
#include <tuple>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

namespace {

// A message's key: (activation?, micro-batch, receiving virtual stage).
using MessageKey = std::tuple<bool, int, int>;

MessageKey sent_key(const Schedule& s, int stage, const PipeAction& a) {
  const int vs = s.virtual_stage(stage, a.chunk);
  return a.op == PipeOp::kSendActivation ? MessageKey{true, a.microbatch, vs + 1} : MessageKey{false, a.microbatch, vs - 1};
}

MessageKey received_key(const Schedule& s, int stage, const PipeAction& a) {
  return {a.op == PipeOp::kRecvActivation, a.microbatch, s.virtual_stage(stage, a.chunk)};
}

bool is_send(PipeOp op) { return op == PipeOp::kSendActivation || op == PipeOp::kSendGrad; }
bool is_recv(PipeOp op) { return op == PipeOp::kRecvActivation || op == PipeOp::kRecvGrad; }

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
    LOOM_CHECK(replay->transfer_ms.empty() || replay->transfer_ms.size() == static_cast<size_t>(s.stages));
    for (size_t st = 0; st < replay->transfer_ms.size(); ++st)
      LOOM_CHECK_EQ(replay->transfer_ms[st].size(), s.actions[st].size());
  }
  const bool own_transfers = replay && !replay->transfer_ms.empty();
  const int p = s.stages, v = s.virtual_stages;
  Simulation sim;
  sim.busy_ms.assign(p, 0);
  sim.peak_in_flight.assign(p, 0);
  const std::vector<double> start = replay && !replay->start_ms.empty() ? replay->start_ms : std::vector<double>(p, 0.0);
  std::vector<double> now = start;
  std::vector<size_t> next(p, 0);
  std::vector<int> in_flight(p, 0);
  // Each message's send: when, and the sender's transfer time.
  std::map<MessageKey, std::pair<double, double>> sent;
  size_t remaining = 0;
  for (const auto& list : s.actions) remaining += list.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.actions[st];
      while (next[st] < list.size()) {
        const PipeAction& a = list[next[st]];
        const double overhead = replay ? replay->overhead_ms[st][next[st]] : per_stage[st].overhead_ms;
        if (is_recv(a.op)) {
          auto it = sent.find(received_key(s, st, a));
          if (it == sent.end()) break;  // blocked until the sender gets there
          const auto [sent_at, transfer] = it->second;
          const double arrival = own_transfers ? std::max(sent_at, now[st]) + replay->transfer_ms[st][next[st]]
                                               : sent_at + transfer;
          now[st] += overhead;  // posting the receive; its data is waited for after
          if (arrival > now[st]) {
            sim.timeline.push_back({st, a, now[st], arrival});
            now[st] = arrival;
          }
          ++next[st];
          --remaining;
          progressed = true;
          continue;
        }
        if (is_send(a.op)) {
          sent[sent_key(s, st, a)] = {now[st], per_stage[st].transfer_ms};
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
        now[st] += overhead;
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

std::vector<std::vector<double>> in_step_transfers(const Schedule& s, const std::vector<std::vector<double>>& begin_ms,
                                                   const std::vector<std::vector<double>>& landed_ms) {
  LOOM_CHECK_EQ(begin_ms.size(), static_cast<size_t>(s.stages));
  LOOM_CHECK_EQ(landed_ms.size(), static_cast<size_t>(s.stages));
  std::map<MessageKey, double> posted;  // each send's posting
  for (int st = 0; st < s.stages; ++st) {
    LOOM_CHECK_EQ(begin_ms[st].size(), s.actions[st].size());
    LOOM_CHECK_EQ(landed_ms[st].size(), s.actions[st].size());
    for (size_t i = 0; i < s.actions[st].size(); ++i)
      if (is_send(s.actions[st][i].op)) posted[sent_key(s, st, s.actions[st][i])] = begin_ms[st][i];
  }
  std::vector<std::vector<double>> out;
  for (int st = 0; st < s.stages; ++st) {
    out.emplace_back(s.actions[st].size(), 0.0);
    for (size_t i = 0; i < s.actions[st].size(); ++i) {
      const PipeAction& a = s.actions[st][i];
      if (!is_recv(a.op)) continue;
      const double both = std::max(begin_ms[st][i], posted.at(received_key(s, st, a)));
      out[st][i] = std::max(0.0, landed_ms[st][i] - both);
    }
  }
  return out;
}

}  // namespace loom::parallel
