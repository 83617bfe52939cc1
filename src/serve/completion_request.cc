#include "loom/serve/completion_request.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/checkpoint/bounded_json.h"
#include "loom/core/error.h"

namespace loom::serve {

using nlohmann::json;

CompletionRequest parse_completion_request(std::string_view body, const std::function<ModelText(const std::string&)>& model_of,
                                           int64_t max_tokens_cap) {
  json j;
  try {
    j = parse_json_bounded(body, "the body", kRequestLimits);
  } catch (const InputError& e) {
    throw Refusal{400, e.what()};
  }
  if (!j.is_object()) throw Refusal{400, "the body must be a JSON object"};
  static const std::set<std::string> known = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                                              "stream", "n", "user"};
  for (const auto& [key, value] : j.items())
    if (!known.contains(key)) throw Refusal{400, cat("unknown field \"", printable(key), "\"")};
  CompletionRequest c;
  if (!j.contains("model") || !j["model"].is_string()) throw Refusal{400, "\"model\": expected a model name (GET /v1/models)"};
  c.model = j["model"].get<std::string>();
  const ModelText model = model_of(c.model);
  const int64_t vocab = model.vocab;
  if (vocab < 1) throw Refusal{404, cat("\"model\": no model named \"", printable(c.model), "\"")};
  c.generation.tokenizer = model.tokenizer;
  const json& p = j.contains("prompt") ? j["prompt"] : json("");
  if (p.is_string()) {
    if (!model.tokenizer)
      throw Refusal{400, cat("\"prompt\": model \"", printable(c.model), "\" has a vocabulary of ", vocab,
                             " tokens and no tokenizer here; expected an array of token ids")};
    data::Tokenizer t = *model.tokenizer;  // its own piece cache
    // An empty prompt starts a document: <|endoftext|>, or a newline for bytes.
    const std::string text = p.get<std::string>();
    c.generation.prompt = text.empty() && t.end_of_text() >= 0 ? std::vector<int32_t>{t.end_of_text()}
                                                               : t.encode(text.empty() ? std::string("\n") : text);
  } else if (p.is_array()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        throw Refusal{400, cat("\"prompt\": token ids must be integers in [0, ", vocab, ")")};
      c.generation.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    throw Refusal{400, "\"prompt\": expected a string or an array of token ids"};
  }
  if (c.generation.prompt.empty()) c.generation.prompt.push_back(static_cast<int32_t>(vocab - 1));
  auto number = [&](const char* key, double lo, double hi, double fallback) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number() || !(j[key].get<double>() >= lo && j[key].get<double>() <= hi))
      throw Refusal{400, cat("\"", key, "\": expected a number in [", lo, ", ", hi, "]")};
    return j[key].get<double>();
  };
  if (j.contains("max_tokens") && !j["max_tokens"].is_number_integer())
    throw Refusal{400, cat("\"max_tokens\": expected an integer in [0, ", max_tokens_cap, "]")};
  c.generation.max_tokens = static_cast<int64_t>(number("max_tokens", 0, static_cast<double>(max_tokens_cap), 16));
  c.generation.sampling.temperature = number("temperature", 0, 100, 1);
  c.generation.sampling.top_p = number("top_p", 0, 1, 1);
  if (c.generation.sampling.top_p == 0) throw Refusal{400, "\"top_p\": expected a number in (0, 1]"};
  if (j.contains("seed") && !j["seed"].is_number_integer()) throw Refusal{400, "\"seed\": expected an integer"};
  c.generation.seed = j.contains("seed") ? j["seed"].get<uint64_t>() : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  if (j.contains("n") && j["n"] != 1) throw Refusal{400, "\"n\": only 1 completion per request"};
  if (j.contains("stream") && !j["stream"].is_boolean()) throw Refusal{400, "\"stream\": expected true or false"};
  c.stream = j.value("stream", false);
  if (j.contains("stop") && !c.generation.tokenizer) throw Refusal{400, "\"stop\": stop sequences are text; this model generates token ids"};
  if (j.contains("stop")) {
    const json& s = j["stop"];
    const json list = s.is_array() ? s : json::array({s});
    if (list.size() > 4) throw Refusal{400, "\"stop\": at most 4 sequences"};
    for (const json& x : list) {
      if (!x.is_string() || x.get<std::string>().empty()) throw Refusal{400, "\"stop\": expected non-empty strings"};
      c.generation.stop.push_back(x.get<std::string>());
    }
  }
  return c;
}

}  // namespace loom::serve
