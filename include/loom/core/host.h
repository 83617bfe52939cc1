// What the host this process runs on can give it.
// Thread-safety: reentrant.
#pragma once

namespace loom {

// Bytes a new allocation can have now: /proc/meminfo's MemAvailable, capped by what this
// process's cgroup (v2) limit leaves.
double available_memory_bytes();
// From now on available_memory_bytes() returns `bytes` in place of its measurement: a
// budget the process was given (LOOM_HOST_MEMORY, read by the CLI), so that every check
// against memory gives the same verdict on any machine; 0 measures again. REQUIRES:
// bytes >= 0; called before other threads ask.
void set_memory_budget(double bytes);

// The cores this process may run on: its CPU affinity (taskset, a container's or Slurm's
// cpuset), at least 1. Not the machine's count: a rank bound to 2 of 16 cores has 2.
int available_cores();

// CPU seconds this process has run, every thread's (CLOCK_PROCESS_CPUTIME_ID: a system
// call, not the vDSO): unlike wall time, it does not grow while a shared machine runs
// someone else on our cores.
double process_cpu_seconds();

// This process's peak resident memory (VmHWM), MiB: since it started, and since the last
// begin_memory_phase() (the kernel's high-water mark reset to the current resident size;
// where the kernel refuses, a phase's peak is the process's). Not for concurrent phases.
double peak_resident_mb();
void begin_memory_phase();
double phase_peak_resident_mb();

}  // namespace loom
