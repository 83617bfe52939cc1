// Loading a GPT to generate with or evaluate (`loom sample`, `loom eval`, `loom serve`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "loom/checkpoint.h"
#include "loom/nn/gpt.h"

namespace loom::app {

// A config file (optional) and --section.key=value overrides, resolved, with the compute
// settings (threads, GEMM) applied.
Config inference_config(const std::string& path, const std::vector<std::string>& overrides);
// The shape of the GPT a checkpoint holds, from state.json or read off a bare safetensors
// file (n_head from `c`), checked to make a GPT and to agree with the weights' shapes;
// nothing is loaded. InputError names the file and field.
nn::GptConfig gpt_shape_of(const checkpoint::Checkpoint& ck, const Config& c);
// The GPT a checkpoint holds, its shape from state.json or read off a bare safetensors file
// (n_head from `c`), checked against the weights before it is built. Warns about NaN or
// Inf weights. InputError names the file and field.
std::unique_ptr<nn::Gpt> load_gpt(const checkpoint::Checkpoint& ck, const Config& c);

}  // namespace loom::app
