// Pipeline schedules: every generator's lists are valid and deadlock-free, the simulator
// reproduces the closed-form bubbles, and 1F1B bounds what is in flight.
#include <gtest/gtest.h>

#include <map>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {
namespace {

struct Layout {
  ScheduleKind kind;
  int p, m, v;
};

// Every schedule at p in 1..4 and each micro-batch count 1..16 it accepts.
std::vector<Layout> all_layouts() {
  std::vector<Layout> out;
  for (auto kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved, ScheduleKind::kZeroBubble})
    for (int p = 1; p <= 4; ++p)
      for (int v : kind == ScheduleKind::kInterleaved ? std::vector<int>{2, 3} : std::vector<int>{1})
        for (int m = 1; m <= 16; ++m) {
          const MicrobatchRule r = microbatch_rule(kind, p, v);
          if (m >= r.minimum && m % r.multiple_of == 0) out.push_back({kind, p, m, v});
        }
  return out;
}

std::string name(const Layout& l) {
  return cat(schedule_kind_name(l.kind), " p=", l.p, " m=", l.m, " v=", l.v);
}

TEST(Schedule, EveryGeneratedListIsValidAndRunsToTheEnd) {
  for (const Layout& l : all_layouts()) {
    const Schedule s = make_schedule(l.kind, l.p, l.m, l.v);
    EXPECT_EQ(check_schedule(s), "") << name(l);
    EXPECT_NO_THROW(simulate(s, {.transfer_ms = 0.3})) << name(l);
  }
}

TEST(Schedule, SimulatedBubbleEqualsTheClosedForms) {
  // Uniform stages and free transfers: F = 1, B = 2 (zero-bubble: B_input = B_weight = 1).
  for (const Layout& l : all_layouts()) {
    const Simulation sim = simulate(make_schedule(l.kind, l.p, l.m, l.v), {.forward_ms = 1, .backward_ms = 2});
    if (l.kind == ScheduleKind::kZeroBubble && l.m < l.p) {
      // Too few weight passes to fill the bubble (ZB-H1's closed form assumes m >= p),
      // but still less idle than 1F1B.
      const Simulation f = simulate(make_schedule(ScheduleKind::kOneFOneB, l.p, l.m), {.forward_ms = 1, .backward_ms = 2});
      EXPECT_LT(sim.bubble, f.bubble) << name(l);
      continue;
    }
    EXPECT_NEAR(sim.bubble, closed_form_bubble(l.kind, l.p, l.m, l.v), 1e-12) << name(l);
  }
}

TEST(Schedule, ClosedFormsAreTheKnownOnes) {
  EXPECT_DOUBLE_EQ(closed_form_bubble(ScheduleKind::kGpipe, 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(closed_form_bubble(ScheduleKind::kOneFOneB, 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(closed_form_bubble(ScheduleKind::kInterleaved, 4, 8, 2), 3.0 / 19);
  EXPECT_DOUBLE_EQ(closed_form_bubble(ScheduleKind::kZeroBubble, 4, 8, 1), 3.0 / 27);
}

TEST(Schedule, OneFOneBHoldsAtMostPMicroBatchesGpipeHoldsAll) {
  for (int p = 1; p <= 4; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Simulation f = simulate(make_schedule(ScheduleKind::kOneFOneB, p, m), {});
      const Simulation g = simulate(make_schedule(ScheduleKind::kGpipe, p, m), {});
      const Simulation z = simulate(make_schedule(ScheduleKind::kZeroBubble, p, m), {});
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(f.peak_in_flight[s], std::min(p - s, m)) << "p=" << p << " m=" << m << " stage " << s;
        EXPECT_EQ(g.peak_in_flight[s], m);
        EXPECT_LE(z.peak_in_flight[s], std::min(p, m)) << "zb-h1 p=" << p << " m=" << m << " stage " << s;
      }
    }
}

TEST(Schedule, GradientsAccumulateInMicroBatchOrder) {
  // One process adds micro-batch 0's gradients first; every schedule must too, so that
  // pipelining never changes the bits of a sum.
  for (const Layout& l : all_layouts()) {
    const Schedule s = make_schedule(l.kind, l.p, l.m, l.v);
    for (int st = 0; st < l.p; ++st) {
      std::map<int, int> last;  // chunk -> last micro-batch whose weight gradients ran
      for (const PipeAction& a : s.actions[st]) {
        if (a.op != PipeOp::kBackward && a.op != PipeOp::kBackwardWeight) continue;
        auto it = last.find(a.chunk);
        if (it != last.end()) {
          EXPECT_LT(it->second, a.microbatch) << name(l) << " stage " << st;
        }
        last[a.chunk] = a.microbatch;
      }
    }
  }
}

TEST(Schedule, TheCheckerFindsBrokenLists) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2);
  Schedule dup = s;
  dup.actions[0].push_back({PipeOp::kForward, 1, 0});
  EXPECT_NE(check_schedule(dup).find("twice"), std::string::npos) << check_schedule(dup);

  Schedule missing = s;
  std::erase(missing.actions[1], PipeAction{PipeOp::kBackward, 0, 0});
  EXPECT_NE(check_schedule(missing).find("stage 1, micro-batch 0"), std::string::npos) << check_schedule(missing);

  Schedule order = s;  // stage 0 sends micro-batch 1 before 0
  auto& a0 = order.actions[0];
  auto first = std::find(a0.begin(), a0.end(), PipeAction{PipeOp::kSendActivation, 0, 0});
  auto second = std::find(a0.begin(), a0.end(), PipeAction{PipeOp::kSendActivation, 1, 0});
  std::iter_swap(first, second);
  EXPECT_NE(check_schedule(order), "");
}

TEST(Schedule, TheSimulatorNamesADeadlock) {
  // Stage 0 waits for micro-batch 0's gradient before sending its activation.
  Schedule s{.kind = ScheduleKind::kGpipe, .stages = 2, .microbatches = 1, .virtual_stages = 1};
  s.actions = {{{PipeOp::kForward, 0, 0}, {PipeOp::kRecvGrad, 0, 0}, {PipeOp::kSendActivation, 0, 0}, {PipeOp::kBackward, 0, 0}},
               {{PipeOp::kRecvActivation, 0, 0}, {PipeOp::kForward, 0, 0}, {PipeOp::kBackward, 0, 0}, {PipeOp::kSendGrad, 0, 0}}};
  ASSERT_EQ(check_schedule(s), "");
  try {
    simulate(s, {});
    FAIL() << "no deadlock found";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0 waits in recv gradient of micro-batch 0"), std::string::npos) << e.what();
  }
}

TEST(Schedule, ImpossibleCombinationsAreRefused) {
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved, 4, 6, 2), InputError);  // not a multiple of p
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved, 4, 2, 2), InputError);  // fewer than p
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, 2, 4, 2), InputError);     // chunks without interleaving
  EXPECT_THROW(schedule_kind_named("zb"), InputError);
  EXPECT_EQ(schedule_kind_named("zb-h1"), ScheduleKind::kZeroBubble);
}

TEST(Schedule, TransfersLengthenTheStep) {
  // GPipe: the last micro-batch crosses 3 links forward, the first gradient 3 links back.
  const Schedule g = make_schedule(ScheduleKind::kGpipe, 4, 8);
  EXPECT_NEAR(simulate(g, {.transfer_ms = 0.5}).step_ms, simulate(g, {}).step_ms + 6 * 0.5, 1e-9);
  // 1F1B waits on a round trip in every steady-state backward of the early stages.
  const Schedule f = make_schedule(ScheduleKind::kOneFOneB, 4, 8);
  EXPECT_GT(simulate(f, {.transfer_ms = 0.5}).step_ms, simulate(f, {}).step_ms + 6 * 0.5);
}

TEST(Schedule, OverheadLengthensTheStepAndCountsAsBubble) {
  // Per action, what the executor spends outside compute and waits: on every stage's list,
  // so the step grows by at least the longest list's count of it, and compute does not.
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    const Schedule sc = make_schedule(kind, 2, 4);
    const Simulation base = simulate(sc, {}), with = simulate(sc, {.overhead_ms = 0.25});
    size_t longest = 0;
    for (const auto& list : sc.actions) longest = std::max(longest, list.size());
    EXPECT_GE(with.step_ms, base.step_ms + 0.25 * static_cast<double>(longest) - 1e-9) << schedule_kind_name(kind);
    EXPECT_EQ(with.busy_ms, base.busy_ms) << schedule_kind_name(kind);
    EXPECT_GT(with.bubble, base.bubble) << schedule_kind_name(kind);
  }
}

TEST(Schedule, ReplayTakesEachActionsOwnTimes) {
  // Every action at its stage's mean: the replay is the simulation from the means.
  const PipeCosts c{.forward_ms = 1, .backward_ms = 2, .backward_input_ms = 0.75, .backward_weight_ms = 1.25,
                    .transfer_ms = 0.1, .overhead_ms = 0.05};
  for (const Layout& l : all_layouts()) {
    const Schedule s = make_schedule(l.kind, l.p, l.m, l.v);
    PipeActionTimes replay;
    for (const auto& list : s.actions) {
      replay.compute_ms.emplace_back();
      for (const PipeAction& a : list) {
        const double ms = a.op == PipeOp::kForward           ? c.forward_ms
                          : a.op == PipeOp::kBackward        ? c.backward_ms
                          : a.op == PipeOp::kBackwardInput   ? c.backward_input_ms
                          : a.op == PipeOp::kBackwardWeight  ? c.backward_weight_ms
                                                             : 0.0;
        replay.compute_ms.back().push_back(ms / l.v);
      }
      replay.overhead_ms.emplace_back(list.size(), c.overhead_ms);
    }
    const Simulation means = simulate(s, c), replayed = simulate_stages(s, std::vector<PipeCosts>(l.p, c), &replay);
    EXPECT_NEAR(replayed.step_ms, means.step_ms, 1e-9) << name(l);
    EXPECT_NEAR(replayed.bubble, means.bubble, 1e-12) << name(l);
  }
  // GPipe, 2 stages, 2 micro-batches, every action 1 ms but stage 0's first forward and
  // stage 1's second take 3 ms: stage 1 runs F0 at 3..4 and F1 at 4..7, its backward passes
  // end at 9, stage 0's at 10. The means (every forward 2 ms) give 9: uneven actions wait
  // longer than their means.
  const Schedule g = make_schedule(ScheduleKind::kGpipe, 2, 2);
  PipeActionTimes replay;
  for (int st = 0; st < 2; ++st) {
    replay.compute_ms.emplace_back();
    for (const PipeAction& a : g.actions[st])
      replay.compute_ms.back().push_back(!pipe_op_computes(a.op)                                   ? 0.0
                                         : a.op == PipeOp::kForward && a.microbatch == st ? 3.0
                                                                                          : 1.0);
    replay.overhead_ms.emplace_back(g.actions[st].size(), 0.0);
  }
  const std::vector<PipeCosts> means(2, {.forward_ms = 2, .backward_ms = 1});
  const Simulation sim = simulate_stages(g, means, &replay);
  EXPECT_DOUBLE_EQ(sim.step_ms, 10);
  EXPECT_DOUBLE_EQ(sim.busy_ms[0], 6);
  EXPECT_DOUBLE_EQ(simulate_stages(g, means).step_ms, 9);
}

TEST(Schedule, ReplayTakesEachMessagesOwnTransfer) {
  // GPipe, 2 stages, 2 micro-batches, every compute 1 ms. Stage 1 posts micro-batch 1's
  // receive at 2.5, after its send at 2; that message's transfer (2 ms: a late-waking
  // receiver) counts from the posting, so F1 runs at 4.5..5.5 and stage 0's last backward
  // ends at 8.5. Micro-batch 0's activation (0.5 ms) arrives at 1.5, while stage 1 waits.
  const Schedule g = make_schedule(ScheduleKind::kGpipe, 2, 2);
  PipeActionTimes replay;
  for (int st = 0; st < 2; ++st) {
    replay.compute_ms.emplace_back();
    replay.transfer_ms.emplace_back();
    for (const PipeAction& a : g.actions[st]) {
      replay.compute_ms.back().push_back(pipe_op_computes(a.op) ? 1.0 : 0.0);
      replay.transfer_ms.back().push_back(a.op != PipeOp::kRecvActivation ? 0.0 : a.microbatch == 0 ? 0.5 : 2.0);
    }
    replay.overhead_ms.emplace_back(g.actions[st].size(), 0.0);
  }
  const std::vector<PipeCosts> costs(2, {.forward_ms = 1, .backward_ms = 1});
  EXPECT_DOUBLE_EQ(simulate_stages(g, costs, &replay).step_ms, 8.5);
  const std::vector<std::vector<double>> transfers = replay.transfer_ms;
  replay.transfer_ms.clear();  // every message at its sender's transfer_ms (0) after the send
  EXPECT_DOUBLE_EQ(simulate_stages(g, costs, &replay).step_ms, 6);

  // The same transfers from a step's clock readings: each receive lands its transfer after
  // the later of its posting and its send's.
  std::vector<std::vector<double>> begin(2), landed(2);
  for (int st = 0; st < 2; ++st)
    for (const PipeAction& a : g.actions[st]) {
      const bool mb0 = a.microbatch == 0;
      double at = 0, land = 0;
      if (a.op == PipeOp::kSendActivation) at = mb0 ? 11 : 12;
      if (a.op == PipeOp::kRecvActivation) {
        at = mb0 ? 10 : 12.5;  // posted before its send, then after
        land = mb0 ? 11.5 : 14.5;
      }
      if (a.op == PipeOp::kSendGrad) at = mb0 ? 16.5 : 17.5;
      if (a.op == PipeOp::kRecvGrad) {
        at = 13;
        land = mb0 ? 16.5 : 17.5;
      }
      begin[st].push_back(at);
      landed[st].push_back(land);
    }
  EXPECT_EQ(in_step_transfers(g, begin, landed), transfers);
}

TEST(Schedule, TextTimelineShowsWhoWorksWhen) {
  const Schedule s = make_schedule(ScheduleKind::kGpipe, 2, 2);
  const Simulation sim = simulate(s, {.forward_ms = 1, .backward_ms = 1});
  EXPECT_DOUBLE_EQ(sim.step_ms, 6);
  EXPECT_EQ(draw_text(s, sim, 12), "stage 0 |F0F1....B0B1|\nstage 1 |..F0F1B0B1..|\n");
}

TEST(Schedule, SvgHasOneBoxPerComputeAction) {
  const Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 4, 2);
  const Simulation sim = simulate(s, {});
  const std::string svg = draw_svg(s, sim, "interleaved");
  size_t boxes = 0;
  for (size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) ++boxes;
  EXPECT_EQ(boxes, static_cast<size_t>(2 * 2 * 4 * 2));  // stages x chunks x micro-batches x (F, B)
  EXPECT_TRUE(svg.starts_with("<svg ")) << svg.substr(0, 40);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
}

}  // namespace
}  // namespace loom::parallel
