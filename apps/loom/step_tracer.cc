#include "step_tracer.h"

#include "loom/fileio.h"
#include "stages.h"

namespace loom::app {

void write_merged_trace(comm::Communicator& world, const obs::Trace& trace, const std::string& path) {
  const std::vector<std::string> parts = all_gather_strings(world, trace.events(world.rank()));
  if (world.rank() == 0) write_file_atomic(path, obs::merge_traces(parts));
}

}  // namespace loom::app
