#include "loom/parallel/step_tracer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/nn/step_breakdown.h"
#include "loom/parallel/mesh.h"

namespace loom::parallel {
namespace fs = std::filesystem;
using json = nlohmann::json;

StepTracer::~StepTracer() { trace_step_parts(nullptr); }

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

void trace_step_parts(StepTracer* tracer) {
  if (tracer == nullptr) return nn::observe_step_parts(nullptr);
  nn::observe_step_parts([tracer](nn::StepPart part, obs::Trace::Clock::time_point begin,
                                  obs::Trace::Clock::time_point end) {
    tracer->trace().span(obs::Trace::kTraining, nn::step_part_name(part), begin, end);
  });
}

void write_merged_trace(comm::Communicator& world, const obs::Trace& trace, const std::string& path) {
  const std::vector<std::string> parts = all_gather_strings(world, trace.events(world.rank()));
  if (world.rank() == 0) write_file_atomic(path, obs::merge_traces(parts));
}

std::string dump_flight_record(const std::string& run, int rank, int64_t step, const std::string& error,
                               const std::vector<std::pair<std::string, const comm::Communicator*>>& comms) {
  try {
    json doc = {{"rank", rank}, {"step", step}, {"error", error}, {"communicators", json::object()}};
    for (const auto& [name, c] : comms) {
      if (c == nullptr) continue;
      json ops = json::array();
      for (const comm::Communicator::FlightRecord& r : c->flight_record()) {
        json op = {{"seq", r.seq}, {"op", r.op}, {"state", r.state}};
        if (!r.error.empty()) op["error"] = r.error;
        ops.push_back(op);
      }
      doc["communicators"][name] = {{"rank", c->rank()}, {"size", c->size()}, {"ops", ops}};
    }
    const fs::path dir = fs::path(run) / "logs";
    fs::create_directories(dir);
    const std::string path = (dir / cat("flight-rank", rank, ".json")).string();
    write_file_atomic(path, doc.dump(1) + "\n");
    return path;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace loom::parallel
