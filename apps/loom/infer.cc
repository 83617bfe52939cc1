// `loom sample` and `loom eval`: load a GPT from a checkpoint directory or a bare
// safetensors file (e.g. Hugging Face GPT-2 weights) and generate or evaluate.
#include <algorithm>
#include <limits>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "commands.h"
#include "config.h"
#include "infer.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/data/data.h"
#include "loom/data/tokenizer.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/obs/metrics.h"
#include "loom/core/rng.h"
#include "loom/serve/sampler.h"
#include "loom/train/workload.h"
#include "loom/parallel/parallelize.h"

namespace loom::app {

Config inference_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  if (!path.empty()) c.merge_file(path);
  c.apply_overrides(overrides);
  if (c.s("data.train").empty()) c.set("data.train", std::string("-"));  // not used here
  c.resolve();
  apply_compute_settings(c);
  return c;
}

int run_eval(const EvalArgs& a) {
  if (a.batch <= 0) throw InputError(cat("--batch ", a.batch, ": expected a positive integer"));
  Config c = inference_config(a.config, a.overrides);
  const bool int8 = quantize_named(a.quantize);
  auto ck = checkpoint::Checkpoint::open(a.checkpoint);
  auto gpt = serve::load_gpt(ck, c.i("model.n_head"), int8);
  std::vector<uint16_t> tokens;
  if (a.data.starts_with("text:")) {  // text through the model's tokenizer
    std::optional<data::Tokenizer> tok = serve::model_tokenizer(ck, a.tokenizer, gpt->config().vocab_size);
    if (!tok)
      throw InputError(cat("--data ", printable(a.data), ": the model (vocabulary ", gpt->config().vocab_size,
                           ") has no tokenizer; give --tokenizer, or a token file"));
    if (tok->vocab_size() > 65536) throw InputError(cat("--data: tokenizer ids above 65535 do not fit a token window (uint16)"));
    for (const data::TextFile& f : data::read_text_sources({a.data}))
      for (int32_t id : tok->encode(f.text)) tokens.push_back(static_cast<uint16_t>(id));
  } else {
    tokens = data::read_tokens(a.data);
  }
  train::check_vocab(tokens, gpt->config().vocab_size, a.data);
  int64_t t = gpt->config().seq_len;
  if (c.explicitly_set("model.seq_len")) t = std::min(t, c.i("model.seq_len"));
  const parallel::EvalResult r = parallel::evaluate(*gpt, data::TokenWindows(std::move(tokens), t), 0, a.batch);
  std::printf("{\"loss\": %s, \"tokens\": %lld}\n", obs::json_number(r.loss).c_str(), static_cast<long long>(r.items));
  return 0;
}

namespace {
// "--prompt 15496 11 995": a model without a tokenizer is prompted with token ids.
std::vector<int32_t> ids_of(const std::string& prompt, int64_t vocab) {
  std::vector<int32_t> ids;
  std::istringstream in(prompt);
  for (std::string w; in >> w;) {
    char* end = nullptr;
    const long long id = std::strtoll(w.c_str(), &end, 10);
    if (end != w.c_str() + w.size() || w.size() > 12 || id < 0 || id >= vocab)
      throw InputError(cat("--prompt: \"", printable(w.substr(0, 40)), "\": this model has no tokenizer (vocabulary ", vocab,
                           "), so the prompt is token ids 0 to ", vocab - 1,
                           " separated by spaces; or give --tokenizer (e.g. gpt2:DIR)"));
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) ids.push_back(static_cast<int32_t>(vocab - 1));
  return ids;
}
}  // namespace

int run_sample(const SampleArgs& a) {
  check_flag_range("--tokens", a.tokens, 0, int64_t{1} << 30);
  check_flag_range("--lines", a.lines, 0, int64_t{1} << 30);
  check_flag_range("--top-k", a.top_k, 0, int64_t{1} << 30);
  check_flag_range("--seed", a.seed, 0, std::numeric_limits<int64_t>::max());
  if (!(a.temperature > 0 && a.temperature <= 1e6))
    throw InputError(cat("--temperature = ", a.temperature, ": expected a number in (0, 1e6]"));
  if (!(a.top_p > 0 && a.top_p <= 1)) throw InputError(cat("--top-p = ", a.top_p, ": expected a number in (0, 1]"));
  Config c = inference_config(a.config, a.overrides);
  const bool int8 = quantize_named(a.quantize);
  auto ck = checkpoint::Checkpoint::open(a.checkpoint);
  auto gpt = serve::load_gpt_for_decoding(ck, c.i("model.n_head"), int8);
  const int64_t vocab = gpt->config().vocab_size;
  // Text through the tokenizer (--tokenizer, the checkpoint's, or bytes); without one the
  // prompt and the output are token ids.
  std::optional<data::Tokenizer> tok = serve::model_tokenizer(ck, a.tokenizer, vocab);
  std::vector<int32_t> seq;
  if (tok) {
    // An empty prompt continues from a newline: lines are what --lines counts, and a model
    // that saw few documents end (the fortunes' 43 files) writes poorly after <|endoftext|>,
    // which a prompt can still name.
    seq = tok->encode(a.prompt.empty() ? std::string("\n") : a.prompt);
  } else {
    seq = a.prompt.empty() ? std::vector<int32_t>{static_cast<int32_t>(vocab - 1)} : ids_of(a.prompt, vocab);
  }
  const size_t prompt_len = seq.size();
  Rng rng(static_cast<uint64_t>(a.seed), /*stream=*/3);
  const auto start = std::chrono::steady_clock::now();
  serve::generate(*gpt, seq, a.tokens, a.lines, tok ? serve::newlines_per_token(*tok) : std::vector<uint8_t>{},
                  {.temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p}, rng, a.kv_cache);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto made = static_cast<int64_t>(seq.size() - prompt_len);
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.3f s (%.0f tokens/s", secs, static_cast<double>(made) / std::max(secs, 1e-9));
  log_info(cat("sample: ", made, " tokens in ", rate, gpt->int8() ? ", int8 weights" : "",
               a.kv_cache ? "" : ", no key/value cache", ")"));
  if (tok) {
    // A model's bytes can be anything: escape sequences, C1 controls, broken UTF-8. Only
    // newlines and tabs reach the output as they are (docs/security.md, "Printing").
    const std::string text = tok->decode(std::span<const int32_t>(seq).subspan(a.prompt.empty() ? 1 : 0));
    std::printf("%s\n", printable(text, Lines::kKeep).c_str());
  } else {
    for (size_t i = prompt_len; i < seq.size(); ++i) std::printf("%d%c", seq[i], i + 1 == seq.size() ? '\n' : ' ');
  }
  return 0;
}

}  // namespace loom::app
