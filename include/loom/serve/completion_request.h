// A `loom serve` completion request (docs/serving.md), parsed and validated before any
// work: every field's type and range, the model's vocabulary for the prompt. Reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "loom/serve/batcher.h"

namespace loom::serve {

// A request refused: the HTTP status (400 or 404) and one line naming the field.
struct Refusal {
  int status;
  std::string message;
};

struct CompletionRequest {
  std::string model;
  GenerationRequest generation;
  bool stream = false;
};

// What a model reads and writes: its vocabulary size (< 1: no such model) and its
// tokenizer (null: none; prompts are then arrays of ids and the output ids).
struct ModelText {
  int64_t vocab = 0;
  std::shared_ptr<const data::Tokenizer> tokenizer;
};

// body: the request's JSON (bounded: 1 MiB, depth 3); model_of: what a model name reads and
// writes. A string prompt goes through the model's tokenizer. Throws Refusal.
CompletionRequest parse_completion_request(std::string_view body, const std::function<ModelText(const std::string&)>& model_of,
                                           int64_t max_tokens_cap);

}  // namespace loom::serve
