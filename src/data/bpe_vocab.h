// The inside of a byte-level BPE vocabulary, shared by the loader (bpe.cc) and the
// trainer (bpe_train.cc). Not installed: include/loom/data/tokenizer.h is the interface.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct Tokenizer::Vocab {
  struct Entry {
    int32_t id;
    int32_t rank;  // the first merge that makes these bytes; INT32_MAX for a byte
  };
  std::vector<std::string> tokens;                  // bytes by id (a special's text)
  std::vector<std::pair<int32_t, int32_t>> merges;  // by rank: the two ids joined
  std::vector<int32_t> specials;                    // matched literally in text
  std::unordered_map<std::string_view, Entry> entries;  // bytes -> id and rank; specials excluded
  std::array<int32_t, 256> byte_id{};
  int32_t eot = -1;
};

// Builds the lookup tables and checks them: every byte present, no two ids with the same
// bytes, every merge's product present. `where` names the source in errors.
std::shared_ptr<const Tokenizer::Vocab> finish_vocab(std::vector<std::string> tokens,
                                                     const std::vector<std::pair<int32_t, int32_t>>& merges,
                                                     const std::vector<int32_t>& specials, const std::string& where);

// A vocabulary from a directory's encoder.json and vocab.bpe, or from a tokenizer.json's
// text read from `path` (bpe_files.cc); InputError naming the file and what was expected.
std::shared_ptr<const Tokenizer::Vocab> load_gpt2_dir(const std::string& dir);
std::shared_ptr<const Tokenizer::Vocab> parse_hf(std::string_view text, const std::string& path);

// GPT-2's printable alphabet for bytes (bytes_to_unicode) and back; false when `text`
// holds a character outside it.
std::string bytes_to_vocab_text(std::string_view bytes);
bool vocab_text_to_bytes(std::string_view text, std::string& out);
// The ids of one piece (>= 2 bytes) by merges: the quadratic scan (short pieces) or the
// heap (long ones); both give the same ids. Exposed for the test that checks that.
void merge_piece(const Tokenizer::Vocab& v, std::string_view piece, std::vector<int32_t>& out, bool long_path);
// The vocabulary behind a BPE tokenizer (not a bytes one).
const Tokenizer::Vocab& vocab_of(const Tokenizer& t);

// The byte that base id b (0-255) stands for in GPT-2's order (printable bytes first).
uint8_t byte_of_base_id(int b);

}  // namespace loom::data
