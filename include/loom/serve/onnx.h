// A GPT as an ONNX graph (opset 17) for compiled runtimes (docs/formats.md, "ONNX"):
// `input_ids` (batch, sequence) int64 in, `logits` (batch, sequence, vocab) float out, the
// weights as initializers with their Hugging Face names.
// Thread-safety: reentrant.
#pragma once

#include <string>

#include "loom/nn/gpt.h"

namespace loom::serve {

// The serialized ONNX ModelProto of `gpt` (f32 weights). REQUIRES: !gpt.int8().
std::string onnx_graph(const nn::Gpt& gpt);

}  // namespace loom::serve
