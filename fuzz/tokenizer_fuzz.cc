// libFuzzer target: the tokenizer, both what it reads and what it encodes. The first byte
// picks the mode:
//   0 mod 4  the rest is encoder.json, a NUL, then vocab.bpe (as `gpt2:DIR` and a run's
//            checkpoint hand them over); 2 mod 4: a Hugging Face tokenizer.json.
//            Properties: no crash; an InputError names the file; a vocabulary that loads
//            round-trips text made of its own tokens' bytes.
//   odd   the rest is text for a small trained BPE. Properties: GPT-2's pre-tokenization
//         cuts it into non-empty pieces that join back to it, and decode(encode(text)) is
//         the text, whatever its bytes (invalid UTF-8 included).
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"
#include "reader_checks.h"

using namespace loom;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 1) {
    static const data::Tokenizer trained =
        data::train_bpe(std::vector<std::string>{"the cat sat on the mat; the dog's log, don't 123 caf\xc3\xa9 \xe4\xb8\xad"},
                        {.vocab_size = 300})
            .tokenizer;
    std::vector<std::string_view> pieces;
    data::pretokenize(rest, pieces);
    std::string joined;
    for (std::string_view p : pieces) {
      if (p.empty()) fuzz::finding("an empty piece", std::string(rest));
      joined += p;
    }
    if (joined != rest) fuzz::finding("pieces that do not join back to the text", std::string(rest));
    data::Tokenizer t = trained;
    if (t.decode(t.encode(rest)) != rest) fuzz::finding("decode(encode(text)) != text", std::string(rest));
    return 0;
  }
  const size_t nul = rest.find('\0');
  const std::string_view encoder = rest.substr(0, nul), merges = nul == std::string_view::npos ? "" : rest.substr(nul + 1);
  try {
    data::Tokenizer t = data[0] % 4 == 2 ? data::Tokenizer::parse_hf_json(rest, "fuzz/tok/tokenizer.json")
                                         : data::Tokenizer::parse_gpt2_files(encoder, merges, "fuzz/tok", "fuzz");
    std::string text;
    for (int32_t id = 0; id < t.vocab_size() && id < 64; ++id) text += t.token_bytes(id);
    if (t.decode(t.encode(text)) != text) fuzz::finding("a loaded vocabulary that does not round-trip", text);
  } catch (const InputError& e) {
    fuzz::check_input_error(e, "fuzz/tok");
  }
  return 0;
}
