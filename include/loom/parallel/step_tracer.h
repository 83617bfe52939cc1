// The spans of a traced training step (`[profile] trace_steps`, docs/formats.md
// "trace.json"), the collective that merges every rank's into one file, and the flight
// recorder a failed step leaves behind.
// Thread-safety: a StepTracer is used by the training thread (the collectives' observers
// are called on it too).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/comm/comm.h"
#include "loom/parallel/comm_span.h"
#include "loom/core/params.h"
#include "loom/obs/trace.h"

namespace loom::parallel {

// The training thread's spans of a traced step: nested spans for the step, micro-steps,
// forward and backward and each block in them, the optimizer step; the training thread's
// waits on collectives; and, on the communication track, every collective as the progress
// thread ran it.
class StepTracer {
 public:
  explicit StepTracer(obs::Trace& trace) : trace_(trace) {}
  // Stops trace_step_parts's spans on this thread: a step that threw leaves them set.
  ~StepTracer();
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;

  void push(std::string name);
  void pop();

  // Block hooks around data parallelism's (nn::BlockHooks, in this order: before, the data
  // parallel hook, after): spans around each block, data parallelism's waits outside them,
  // so that every wait nests inside forward or backward but beside the blocks.
  void before_block(int block, BlockPhase phase);
  void after_block(int block, BlockPhase phase);

  void on_comm(const CommSpan& s);
  obs::Trace& trace() { return trace_; }

 private:
  struct Open {
    std::string name;
    obs::Trace::Clock::time_point begin;
  };
  obs::Trace& trace_;
  std::vector<Open> open_;
};

// The layers' parts (loom/nn/step_breakdown.h: linear_fwd, attn_bwd, ...) as spans on the
// calling thread's training track, inside the blocks', while `tracer` is set; nullptr stops.
void trace_step_parts(StepTracer* tracer);

// Collective: every rank's events to rank 0, which writes the merged file at `path`.
void write_merged_trace(comm::Communicator& world, const obs::Trace& trace, const std::string& path);

// The flight recorder of each of this rank's communicators, written to
// RUN/logs/flight-rank<R>.json after a failure (docs/launch.md, "Flight recorder"). Returns
// the path, or "" when it could not be written (the failure is what gets reported).
std::string dump_flight_record(const std::string& run, int rank, int64_t step, const std::string& error,
                               const std::vector<std::pair<std::string, const comm::Communicator*>>& comms);

}  // namespace loom::parallel
