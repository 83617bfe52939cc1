// Tokenizers: text <-> token ids. Two kinds:
//   bytes  token i is byte value i (vocabulary 256); what Loom trained on before BPE.
//   bpe    GPT-2's byte-level BPE: text is split by GPT-2's pre-tokenization pattern, each
//          piece's bytes are merged pair by pair (lowest rank first, leftmost on ties), and
//          special tokens (<|endoftext|>) match literally. Loaded from GPT-2's encoder.json +
//          vocab.bpe, a Hugging Face tokenizer.json of the same type, or a directory that
//          `loom tokenizer train` wrote (the same two files). Ids equal OpenAI tiktoken's
//          "gpt2" encoding for valid UTF-8; a byte that is not valid UTF-8 counts as one
//          symbol character (as U+FFFD would) and still round-trips: decode(encode(x)) == x.
// Formats and guarantees: docs/data.md.
// Thread-safety: a Tokenizer caches encoded pieces and is used by one thread at a time;
// copies share the (immutable) vocabulary and are cheap, one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

class Tokenizer {
 public:
  // SPEC: "bytes"; "gpt2:DIR" or DIR (encoder.json and vocab.bpe in DIR); "hf:FILE"
  // (tokenizer.json). InputError naming the file and what was expected otherwise.
  static Tokenizer load(const std::string& spec);
  static Tokenizer bytes();

  bool is_bytes() const { return vocab_ == nullptr; }
  // Ids 0 .. vocab_size() - 1, special tokens included.
  int64_t vocab_size() const;
  // The id of <|endoftext|>, or -1 when the vocabulary has none.
  int32_t end_of_text() const;
  // What load() was given, for messages and run records ("bytes" for bytes()).
  const std::string& spec() const { return spec_; }

  // Appends the ids of `text` to `out`. Special tokens in the text map to their ids
  // (tiktoken's allowed_special="all").
  void encode(std::string_view text, std::vector<int32_t>& out);
  std::vector<int32_t> encode(std::string_view text);
  // The bytes of `ids`; InputError for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;
  // One id's bytes (possibly part of a UTF-8 character).
  std::string_view token_bytes(int32_t id) const;

  // Writes encoder.json and vocab.bpe into `dir` (created), atomically per file. A bytes
  // tokenizer writes nothing and returns false.
  bool save(const std::string& dir) const;
  // The text of encoder.json and vocab.bpe as save() writes them. REQUIRES: !is_bytes().
  std::pair<std::string, std::string> files() const;
  // A BPE tokenizer from those two files' text (read from elsewhere, e.g. a checkpoint);
  // `where` names their directory in errors.
  static Tokenizer parse_gpt2_files(std::string_view encoder_json, std::string_view vocab_bpe, const std::string& where,
                                    std::string spec);
  // This BPE as a Hugging Face tokenizer.json of GPT-2's kind (ByteLevel pre-tokenizer and
  // decoder, the merges as "A B", special tokens as added_tokens). REQUIRES: !is_bytes().
  std::string hf_json() const;
  // A Hugging Face tokenizer.json's text, read from `where`.
  static Tokenizer parse_hf_json(std::string_view tokenizer_json, const std::string& where);

  Tokenizer(const Tokenizer& o);  // shares the vocabulary, not the cache
  Tokenizer& operator=(const Tokenizer& o);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  struct Vocab;  // src/data/bpe_vocab.h
  static Tokenizer from_vocab(std::shared_ptr<const Vocab> vocab, std::string spec);
  friend const Vocab& vocab_of(const Tokenizer& t);

 private:
  Tokenizer();
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);

  std::shared_ptr<const Vocab> vocab_;  // null: bytes
  std::string spec_ = "bytes";
  struct Cache;
  std::unique_ptr<Cache> cache_;  // this copy's own
};

struct TrainBpeOptions {
  int64_t vocab_size = 4096;   // ids in all: 256 bytes + merges + <|endoftext|>
  int64_t min_frequency = 2;   // a pair seen fewer times is never merged
};
struct TrainBpeResult {
  Tokenizer tokenizer;
  int64_t merges = 0, pieces = 0, distinct_pieces = 0, bytes = 0;
};
// A byte-level BPE trained on `texts` (GPT-2's pre-tokenization; the most frequent
// adjacent pair is merged first, ties to the pair whose bytes sort first), so the same
// input always gives the same vocabulary. <|endoftext|> in the text is not learned from;
// it gets the last id.
TrainBpeResult train_bpe(std::span<const std::string> texts, const TrainBpeOptions& options);

// GPT-2's pre-tokenization of `text` into pieces (views into it), without special tokens:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace loom::data
