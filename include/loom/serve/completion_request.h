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

// body: the request's JSON (bounded: 1 MiB, depth 3); vocab_of: a model name's vocabulary
// size, or < 1 when there is no such model. Throws Refusal.
CompletionRequest parse_completion_request(std::string_view body, const std::function<int64_t(const std::string&)>& vocab_of,
                                           int64_t max_tokens_cap);

}  // namespace loom::serve
