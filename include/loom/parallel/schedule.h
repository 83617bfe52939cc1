// Pipeline schedules as data (docs/parallelism.md, "Pipeline schedules"): what each stage
// does, in order, for one optimizer step of M micro-batches. A generator builds the lists
// (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1); one executor runs any list, and the
// simulator below evaluates the same list with per-action costs, so the prediction and
// the run cannot disagree about what the schedule is.
//
// Stages and chunks: p ranks each hold v chunks (virtual stages); chunk c of rank s is
// virtual stage c * p + s (Megatron's interleaved layout), so v = 1 is plain pipelining
// and the model's blocks are cut into p * v contiguous ranges in virtual-stage order.
//
// Thread-safety: values; free functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::parallel {

enum class PipeOp : uint8_t {
  kRecvActivation,  // the chunk's input of this micro-batch, from the previous virtual stage
  kForward,
  kSendActivation,  // the chunk's output, to the next virtual stage
  kRecvGrad,        // d(output), from the next virtual stage
  kBackward,        // input and weight gradients together
  kBackwardInput,   // zero-bubble: d(input) only ...
  kBackwardWeight,  // ... and the weight gradients later
  kSendGrad,        // d(input), to the previous virtual stage
};
const char* pipe_op_name(PipeOp op);
bool pipe_op_computes(PipeOp op);  // forward or a backward pass (not a transfer)

struct PipeAction {
  PipeOp op;
  int microbatch = 0;
  int chunk = 0;  // 0..v-1 on this rank
  bool operator==(const PipeAction&) const = default;
};

enum class ScheduleKind : uint8_t { kGpipe, kOneFOneB, kInterleaved, kZeroBubble };
// "gpipe", "1f1b", "interleaved", "zb-h1"; InputError naming the value otherwise.
ScheduleKind schedule_kind_named(const std::string& name);
const char* schedule_kind_name(ScheduleKind kind);

struct Schedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;          // p
  int microbatches = 1;    // M
  int virtual_stages = 1;  // v, chunks per stage
  std::vector<std::vector<PipeAction>> actions;  // per stage, in execution order

  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  bool first_virtual(int stage, int chunk) const { return virtual_stage(stage, chunk) == 0; }
  bool last_virtual(int stage, int chunk) const { return virtual_stage(stage, chunk) == stages * virtual_stages - 1; }
};

// The fewest micro-batches a schedule accepts, and the multiple it needs (interleaved:
// M a multiple of p, as Megatron's).
struct MicrobatchRule {
  int minimum = 1;
  int multiple_of = 1;
};
MicrobatchRule microbatch_rule(ScheduleKind kind, int stages, int virtual_stages);

// Builds the action lists. InputError naming the numbers for an impossible combination
// (virtual stages with a schedule other than interleaved, M below microbatch_rule).
// Every schedule runs each micro-batch's backward (or weight-gradient) passes of a chunk
// in ascending micro-batch order, so gradients accumulate in the order one process adds
// them.
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int virtual_stages = 1);

// Checks a list (also one read from elsewhere): every (micro-batch, chunk) forwarded and
// backwarded exactly once per stage, forward before backward, input before weight
// gradients, every receive matched by the neighbour's send in the same order. Returns ""
// when valid, else the first problem found, naming the stage and the action.
std::string check_schedule(const Schedule& s);

// Per-action costs for the simulator, in milliseconds for a whole stage (one chunk costs
// 1/v of them). backward_input + backward_weight replace backward in zero-bubble lists;
// when zero they default to halves of backward.
struct PipeCosts {
  double forward_ms = 1;
  double backward_ms = 2;
  double backward_input_ms = 0;
  double backward_weight_ms = 0;
  double transfer_ms = 0;     // one activation or gradient between neighbours
  double activation_mb = 1;   // one micro-batch's saved activations of one whole stage
  // Per action of the stage's list: the executor's time that is neither compute nor a wait
  // for a neighbour (posting receives and sends, bookkeeping, draining the last sends). It
  // lengthens the step and is not compute, so it counts as bubble, as the measured bubble
  // counts it. 0 for a given (ideal) schedule; measured by the executor.
  double overhead_ms = 0;
};

struct SimulatedAction {
  int stage = 0;
  PipeAction action;
  double begin_ms = 0, end_ms = 0;  // for receives: waiting for the data
};

struct Simulation {
  double step_ms = 0;                  // the makespan: the longest stage's, from its start
  double bubble = 0;                   // 1 - compute time / (stages x step_ms)
  std::vector<double> busy_ms;         // compute time per stage
  std::vector<int> peak_in_flight;     // chunks forwarded and not yet done backward, per stage
  std::vector<double> peak_activation_mb;  // peak_in_flight x activation_mb / v
  std::vector<SimulatedAction> timeline;   // compute actions and waits, in completion order
};

// One step as the executor ran it, per stage and per action of that stage's list: the
// action's compute time (0 for sends and receives) and its time that was neither compute nor
// a wait for a neighbour (PipeCosts::overhead_ms, action by action). Given to the simulator
// in place of the per-stage means, it replays the step's own durations (a forward slowed by
// a neighbour on a shared core, a preempted backward) and derives only the waits.
struct PipeActionTimes {
  std::vector<std::vector<double>> compute_ms;   // [stage][action]
  std::vector<std::vector<double>> overhead_ms;  // [stage][action]
  // When each stage began its list, after the earliest (stages leave the previous step's
  // collectives at different times); empty: all at 0. A stage's step is from its own start.
  std::vector<double> start_ms;
  // Each receive's transfer in the step ([stage][action], 0 for other actions): from when
  // both its send and the receive had been posted until the message landed (in_step_transfers).
  // Empty: every message takes its sender's PipeCosts::transfer_ms after the send.
  std::vector<std::vector<double>> transfer_ms;
};

// The transfers of a step the executor ran, for PipeActionTimes::transfer_ms, from each
// stage's PipelineStats::action_begin_ms and action_landed_ms on one clock: a receive's is
// its landing time less the later of its posting and its send's. That leaves out how long
// the receiver waited for the sender to reach the send (the simulator derives that wait),
// and keeps what moving the message cost in the step: waking each side's progress thread
// on a busy core, copying the bytes.
std::vector<std::vector<double>> in_step_transfers(const Schedule& s, const std::vector<std::vector<double>>& begin_ms,
                                                   const std::vector<std::vector<double>>& landed_ms);

// Runs the lists against the costs: compute actions take their cost, sends cost the
// sender nothing, a receive (after its own overhead: posting it) waits until the sender's
// send + transfer_ms. RuntimeError
// when the lists deadlock (naming the stages and what each waits for) or fail
// check_schedule.
Simulation simulate(const Schedule& s, const PipeCosts& costs);
// The same with each stage's own costs (measured stages differ: the first embeds, the last
// computes the head and the loss); a send's transfer_ms is the sender's. With `replay`
// (sized as the lists), each action takes its own measured compute and overhead times, and
// with replay->transfer_ms a receive waits until its message's own transfer has passed
// since both the send and the receive were posted.
Simulation simulate_stages(const Schedule& s, const std::vector<PipeCosts>& per_stage,
                           const PipeActionTimes* replay = nullptr);

// The bubble fraction the closed forms give for uniform stages and free transfers:
// GPipe and 1F1B (p-1)/(m+p-1), interleaved (p-1)/(v m+p-1), ZB-H1 with
// F = B_input = B_weight: (p-1)/(3m+p-1).
double closed_form_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages);

// A text timeline, one row per stage, `width` columns for the step: F/B/b/w letters
// (forward, backward, input and weight gradients) with the micro-batch digit, '.' idle.
std::string draw_text(const Schedule& s, const Simulation& sim, int width = 100);
// A self-contained SVG picture of the same timeline, with a legend and a time axis.
std::string draw_svg(const Schedule& s, const Simulation& sim, const std::string& title);

// `loom plan --schedule all`'s table (schedule_report.cc): one line per schedule (GPipe,
// 1F1B, interleaved with max(2, virtual_stages) chunks, ZB-H1) with the step, bubble, closed
// form and peak activations the simulator predicts from costs_for(v), each stage's costs at
// v chunks per stage. A schedule the micro-batch count does not suit, or whose chunk count
// costs_for refused (an InputError: its message is shown), gets a line saying why.
std::string compare_schedules(int stages, int microbatches, int virtual_stages,
                              const std::function<std::vector<PipeCosts>(int v)>& costs_for);
// One schedule's prediction as `loom plan` prints it: the step and bubble (with the closed
// form), each stage's busy and idle time and peak activations, and the timeline `width`
// columns wide with its legend.
std::string describe_simulation(ScheduleKind kind, const Schedule& s, const Simulation& sim, int width);

}  // namespace loom::parallel
