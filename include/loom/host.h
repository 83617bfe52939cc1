// What the host this process runs on can give it.
// Thread-safety: reentrant.
#pragma once

namespace loom {

// Bytes a new allocation can have now: /proc/meminfo's MemAvailable, capped by what this
// process's cgroup (v2) limit leaves.
double available_memory_bytes();

}  // namespace loom
