// The spans of a traced training step (`[profile] trace_steps`, docs/formats.md
// "trace.json"), and the collective that merges every rank's into one file.
// Thread-safety: StepTracer is used by the training thread; on_comm by whichever thread
// DataParallel calls its observer from (the training thread).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/comm.h"
#include "loom/data_parallel.h"
#include "loom/error.h"
#include "loom/params.h"
#include "loom/trace.h"

namespace loom::app {

// The training thread's spans of a traced step (docs/formats.md, trace.json): nested spans
// for the step, micro-steps, forward and backward and each block in them, the optimizer
// step; the training thread's waits on collectives; and, on the communication track, every
// collective as the progress thread ran it.
class StepTracer {
 public:
  StepTracer(obs::Trace& trace, parallel::DataParallel& dp) : trace_(trace), dp_(dp) {}

  void push(std::string name) { open_.push_back({std::move(name), obs::Trace::Clock::now()}); }
  void pop() {
    trace_.span(obs::Trace::kTraining, open_.back().name, open_.back().begin, obs::Trace::Clock::now());
    open_.pop_back();
  }

  // The block hook while tracing: spans around each block, DataParallel's waits outside
  // them, so that every wait nests inside forward or backward but beside the blocks.
  void on_block(int block, BlockPhase phase) {
    const bool rest = block < 0;
    const bool fwd = phase == BlockPhase::kForward || phase == BlockPhase::kForwardDone;
    switch (phase) {
      case BlockPhase::kForward:
      case BlockPhase::kBackward:
        if (rest) push(fwd ? "forward" : "backward");
        dp_.on_block(block, phase);
        if (!rest) push(cat(fwd ? "forward" : "backward", " block ", block));
        return;
      case BlockPhase::kForwardDone:
      case BlockPhase::kBackwardDone:
        if (!rest) pop();
        dp_.on_block(block, phase);
        if (rest) pop();
        return;
    }
  }

  void on_comm(const parallel::CommSpan& s) {
    trace_.span(obs::Trace::kComm, s.what, s.begin, s.end, {{"bytes", std::to_string(s.bytes)}});
    if (s.wait_end > s.wait_begin) trace_.span(obs::Trace::kTraining, "wait: " + s.what, s.wait_begin, s.wait_end);
  }

 private:
  struct Open {
    std::string name;
    obs::Trace::Clock::time_point begin;
  };
  obs::Trace& trace_;
  parallel::DataParallel& dp_;
  std::vector<Open> open_;
};

// Collective: every rank's events to rank 0, which writes the merged file at `path`.
void write_merged_trace(comm::Communicator& world, const obs::Trace& trace, const std::string& path);

}  // namespace loom::app
