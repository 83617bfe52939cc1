// Logging: one line per message on stderr, prefixed "loom: ". Lines from different
// threads never interleave. The quiet flag silences info() (tests, --quiet).
#pragma once

#include <string>

namespace loom {

void log_info(const std::string& message);
void log_warn(const std::string& message);
void set_log_quiet(bool quiet);

}  // namespace loom
