// libFuzzer target: a `loom serve` completion request body, as the server parses it before
// any work (apps/loom/completion_request.h), against three models: "nano" (a byte-level
// vocabulary of 256), "bpe" (a small trained BPE) and "big" (50257 tokens, ids only).
// Properties: no crash and no library exception escaping; a refusal is a 400 or 404 with a
// message naming a field or the body; an accepted request is within every documented
// range (a prompt of ids inside the model's vocabulary, max_tokens within the cap,
// temperature in [0, 100], top_p in (0, 1], at most 4 non-empty stop sequences, only for a
// model with a tokenizer).
#include "loom/serve/completion_request.h"
#include "reader_checks.h"

using namespace loom;
using namespace loom::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static const auto bytes = std::make_shared<const data::Tokenizer>(data::Tokenizer::bytes());
  static const auto bpe = std::make_shared<const data::Tokenizer>(
      data::train_bpe(std::vector<std::string>{"the cat sat on the mat; the dog sat on the log"}, {.vocab_size = 280}).tokenizer);
  auto vocab_of = [](const std::string& name) -> ModelText {
    if (name == "nano") return {256, bytes};
    if (name == "bpe") return {bpe->vocab_size(), bpe};
    return {name == "big" ? 50257 : -1, nullptr};
  };
  constexpr int64_t kCap = 100;
  try {
    const CompletionRequest c = parse_completion_request(body, vocab_of, kCap);
    const GenerationRequest& g = c.generation;
    const int64_t vocab = vocab_of(c.model).vocab;
    if (vocab < 1) fuzz::finding("accepted an unknown model", c.model);
    if (g.prompt.empty()) fuzz::finding("accepted an empty prompt", std::string(body));
    for (int32_t t : g.prompt)
      if (t < 0 || t >= vocab) fuzz::finding("a prompt id outside the vocabulary", std::to_string(t));
    if (g.max_tokens < 0 || g.max_tokens > kCap) fuzz::finding("max_tokens out of range", std::to_string(g.max_tokens));
    if (!(g.sampling.temperature >= 0 && g.sampling.temperature <= 100))
      fuzz::finding("temperature out of range", std::to_string(g.sampling.temperature));
    if (!(g.sampling.top_p > 0 && g.sampling.top_p <= 1)) fuzz::finding("top_p out of range", std::to_string(g.sampling.top_p));
    if (g.stop.size() > 4 || (!g.stop.empty() && !g.tokenizer)) fuzz::finding("stop sequences not allowed", std::string(body));
    for (const std::string& s : g.stop)
      if (s.empty()) fuzz::finding("an empty stop sequence", std::string(body));
    if ((g.tokenizer != nullptr) != (c.model != "big")) fuzz::finding("text mode disagrees with the model", c.model);
  } catch (const Refusal& r) {
    if (r.status != 400 && r.status != 404) fuzz::finding("a refusal that is not 400 or 404", std::to_string(r.status));
    if (r.message.empty() || r.message.find('\n') != std::string::npos) fuzz::finding("a refusal not one line", r.message);
  }
  return 0;
}
