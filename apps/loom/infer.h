// Loading a GPT to generate with or evaluate (`loom sample`, `loom eval`, `loom serve`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/nn/gpt.h"
#include "loom/serve/gpt_loading.h"

namespace loom::app {

using serve::gpt_weight_bytes;
using serve::holds_int8;
using serve::kv_cache_dtype_named;
using serve::load_int8;
using serve::quantize_named;

// A config file (optional) and --section.key=value overrides, resolved, with the compute
// settings (threads, GEMM) applied.
Config inference_config(const std::string& path, const std::vector<std::string>& overrides);
// `loom ckpt export --format onnx` (apps/loom/onnx_export.cc): the GPT as an ONNX graph at
// `out`; n_head is what a bare safetensors file cannot say (model.n_head).
int export_onnx(const checkpoint::Checkpoint& ck, int64_t n_head, const std::string& out);

}  // namespace loom::app
