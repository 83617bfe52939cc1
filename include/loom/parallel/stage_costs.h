// The pipeline simulator's inputs measured (`loom plan --config`, loom/parallel/schedule.h): each
// stage's part of a GPT built and run on random tokens.
// Thread-safety: reentrant (each call builds its own models).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/nn/gpt_config.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

// Per stage of `stages` x `virtual_stages` chunks: the forward, the backward and its input
// and weight halves (zero-bubble's), in ms for one micro-batch of `micro_batch` windows
// through all of the stage's chunks (the median of 3 after one warm-up), and the activations
// a micro-batch keeps (activation_mb). transfer_ms and overhead_ms are left 0 for the caller.
// REQUIRES: model.n_layer divisible by stages x virtual_stages.
std::vector<PipeCosts> measure_stage_costs(const nn::GptConfig& model, int stages, int virtual_stages, int64_t micro_batch);

}  // namespace loom::parallel
