#include "loom/parallel/step_tracer.h"

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/parallel/mesh.h"

namespace loom::parallel {

void StepTracer::push(std::string name) { open_.push_back({std::move(name), obs::Trace::Clock::now()}); }

void StepTracer::pop() {
  trace_.span(obs::Trace::kTraining, open_.back().name, open_.back().begin, obs::Trace::Clock::now());
  open_.pop_back();
}

namespace {
bool forward_phase(BlockPhase phase) { return phase == BlockPhase::kForward || phase == BlockPhase::kForwardDone; }
bool entering(BlockPhase phase) { return phase == BlockPhase::kForward || phase == BlockPhase::kBackward; }
}  // namespace

// Entering, the rest (block -1) opens "forward" or "backward" before data parallelism's
// hook; leaving, a block's own span closes before it.
void StepTracer::before_block(int block, BlockPhase phase) {
  if (entering(phase) && block < 0) push(forward_phase(phase) ? "forward" : "backward");
  if (!entering(phase) && block >= 0) pop();
}

void StepTracer::after_block(int block, BlockPhase phase) {
  if (entering(phase) && block >= 0) push(cat(forward_phase(phase) ? "forward" : "backward", " block ", block));
  if (!entering(phase) && block < 0) pop();
}

void StepTracer::on_comm(const CommSpan& s) {
  trace_.span(obs::Trace::kComm, s.what, s.begin, s.end, {{"bytes", std::to_string(s.bytes)}});
  if (s.wait_end > s.wait_begin) trace_.span(obs::Trace::kTraining, "wait: " + s.what, s.wait_begin, s.wait_end);
}

void write_merged_trace(comm::Communicator& world, const obs::Trace& trace, const std::string& path) {
  const std::vector<std::string> parts = all_gather_strings(world, trace.events(world.rank()));
  if (world.rank() == 0) write_file_atomic(path, obs::merge_traces(parts));
}

}  // namespace loom::parallel
