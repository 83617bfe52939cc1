// The [debug] keys' test hooks, which crash or slow a rank on demand (docs/launch.md,
// "Stragglers"; docs/formats.md, "Crash safety"). Thread-safety: for the training thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// The [debug] keys (docs/config.md): failures and slowness on demand, for the tests and
// benchmarks that need them. Each is off when empty (0).
//
// debug.fault_at = "POINT:STEP[:RANK]" (docs/formats.md "Crash safety"): this process
// SIGKILLs itself at that point of the save of that step (on that rank; default every rank).
// InputError naming the key when malformed.
void install_fault_hook(const std::string& fault_at, int rank);

// debug.delay_ms = "RANK:MS": that rank sleeps MS ms in every step's compute, a straggler
// on demand. 0 for every other rank.
int64_t step_delay_ms(const std::string& delay_ms, int rank);

// debug.overflow_at = "STEP[,STEP...]" (docs/numerics.md "Mixed precision"): in those steps
// (1-based, as metrics.jsonl counts them) backward runs on the loss times 2^40 on top of
// fp16's loss scale, so its gradients overflow as a diverging step's would.
std::vector<int64_t> overflow_steps(const std::string& overflow_at);

// debug.jitter_ms = MS (benchmarks): every rank stalls now and then, MS per step on
// average: 4 x MS in a quarter of its steps, chosen by a hash of (rank, step), else not at
// all.
int64_t step_jitter_ms(int64_t jitter_ms, int rank, int64_t step);

}  // namespace loom::train
