// Byte-level BPE's files (docs/data.md, "Files"): GPT-2's encoder.json + vocab.bpe and Hugging
// Face's tokenizer.json read and checked into a Tokenizer::Vocab, and written back.
#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "bpe_vocab.h"
#include "json_text.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

// GPT-2's bytes_to_unicode: the printable bytes map to themselves, the others to
// U+0100 onwards in byte order. kOrder lists the bytes in id order (printable first).
struct ByteMap {
  std::array<char32_t, 256> to_char{};
  std::array<uint8_t, 256> order{};
  std::unordered_map<char32_t, uint8_t> from_char;
  ByteMap() {
    int k = 0, extra = 0;
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    for (int b = 0; b < 256; ++b)
      if (printable(b)) {
        to_char[b] = static_cast<char32_t>(b);
        order[k++] = static_cast<uint8_t>(b);
      }
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) {
        to_char[b] = static_cast<char32_t>(256 + extra++);
        order[k++] = static_cast<uint8_t>(b);
      }
    for (int b = 0; b < 256; ++b) from_char[to_char[b]] = static_cast<uint8_t>(b);
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void put_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

std::string bytes_to_vocab_text(std::string_view bytes) {
  std::string out;
  for (char b : bytes) put_utf8(out, byte_map().to_char[static_cast<unsigned char>(b)]);
  return out;
}

bool vocab_text_to_bytes(std::string_view text, std::string& out) {
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    char32_t c;
    size_t len;
    if (b0 < 0x80) {
      c = b0, len = 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < text.size()) {
      c = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu), len = 2;
    } else {
      return false;  // every mapped character is below U+0800
    }
    const auto it = byte_map().from_char.find(c);
    if (it == byte_map().from_char.end()) return false;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

uint8_t byte_of_base_id(int b) { return byte_map().order[b]; }

std::shared_ptr<const Tokenizer::Vocab> finish_vocab(std::vector<std::string> tokens,
                                                     const std::vector<std::pair<int32_t, int32_t>>& merges,
                                                     const std::vector<int32_t>& specials, const std::string& where) {
  auto v = std::make_shared<Tokenizer::Vocab>();
  v->tokens = std::move(tokens);
  v->merges = merges;
  const auto n = static_cast<int32_t>(v->tokens.size());
  v->entries.reserve(v->tokens.size() * 2);
  std::vector<bool> special(v->tokens.size(), false);
  for (int32_t s : specials) {
    special[s] = true;
    v->specials.push_back(s);
    if (v->tokens[s] == "<|endoftext|>") v->eot = s;
  }
  for (int32_t id = 0; id < n; ++id) {
    if (special[id]) continue;
    const auto [it, fresh] = v->entries.emplace(std::string_view(v->tokens[id]), Tokenizer::Vocab::Entry{id, INT32_MAX});
    if (!fresh) throw InputError(cat(where, ": ids ", it->second.id, " and ", id, " are the same bytes"));
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    const auto it = v->entries.find(std::string_view(&byte, 1));
    if (it == v->entries.end())
      throw InputError(cat(where, ": the vocabulary lacks the token for byte ", b,
                           " (a byte-level BPE holds all 256 bytes)"));
    v->byte_id[b] = it->second.id;
  }
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    const std::string joined = v->tokens[a] + v->tokens[b];
    const auto it = v->entries.find(joined);
    if (it == v->entries.end())
      throw InputError(cat(where, ": merge ", r + 1, " (\"", bytes_to_vocab_text(v->tokens[a]), "\" + \"",
                           bytes_to_vocab_text(v->tokens[b]), "\") makes a token the vocabulary lacks"));
    it->second.rank = std::min(it->second.rank, static_cast<int32_t>(r));
  }
  return v;
}

namespace {

constexpr size_t kMaxVocab = size_t{1} << 24;

// Vocabulary object (string -> id) into tokens by id; ids dense from 0.
std::vector<std::string> tokens_of(const nlohmann::json& vocab, const std::string& where) {
  if (!vocab.is_object() || vocab.empty())
    throw InputError(cat(where, ": expected a JSON object mapping token text to id"));
  if (vocab.size() > kMaxVocab) throw InputError(cat(where, ": ", vocab.size(), " tokens, expected at most ", kMaxVocab));
  std::vector<std::string> tokens(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  std::string bytes;
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size()))
      throw InputError(cat(where, ": token \"", printable(text), "\" has id ", printable(id.dump()), ", expected 0 to ",
                           vocab.size() - 1, " (ids dense from 0)"));
    const auto i = id.get<size_t>();
    if (seen[i]) throw InputError(cat(where, ": id ", i, " is given twice"));
    seen[i] = true;
    // Text outside GPT-2's byte alphabet is taken as it is: a special token's.
    tokens[i] = vocab_text_to_bytes(text, bytes) ? bytes : text;
  }
  return tokens;
}

// "A B" pairs (vocab.bpe lines or tokenizer.json's merges) into id pairs.
struct MergeReader {
  const std::vector<std::string>& tokens;
  std::unordered_map<std::string_view, int32_t> ids;
  explicit MergeReader(const std::vector<std::string>& t) : tokens(t) {
    for (size_t i = 0; i < t.size(); ++i) ids.emplace(t[i], static_cast<int32_t>(i));
  }
  std::pair<int32_t, int32_t> pair(std::string_view a, std::string_view b, const std::string& where) {
    std::string x, y;
    auto id = [&](std::string_view text, std::string& bytes) {
      if (!vocab_text_to_bytes(text, bytes)) return -1;
      const auto it = ids.find(bytes);
      return it == ids.end() ? -1 : it->second;
    };
    const int32_t l = id(a, x), r = id(b, y);
    if (l < 0 || r < 0)
      throw InputError(cat(where, ": merge \"", printable(a), " ", printable(b), "\" names a token (\"",
                           printable(l < 0 ? a : b), "\") the vocabulary lacks"));
    return {l, r};
  }
};

// Tokens that are neither a byte nor made by a merge are special (matched literally).
// Tokens that are neither a byte nor made by a merge must be special tokens: named in
// `declared` (tokenizer.json's added_tokens) or written <|...|> (GPT-2's <|endoftext|>).
// Any other is an InputError: the merges file does not make it (one cut short, say).
std::vector<int32_t> specials_of(const std::vector<std::string>& tokens,
                                 const std::vector<std::pair<int32_t, int32_t>>& merges, const std::string& where,
                                 const std::vector<int32_t>& declared = {}) {
  std::vector<bool> made(tokens.size(), false);
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int32_t>(i));
  for (const auto& [a, b] : merges)
    if (const auto it = ids.find(tokens[a] + tokens[b]); it != ids.end()) made[it->second] = true;
  std::vector<int32_t> specials;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].size() <= 1 || made[i]) continue;
    const bool named = std::find(declared.begin(), declared.end(), static_cast<int32_t>(i)) != declared.end();
    if (!named && !(tokens[i].starts_with("<|") && tokens[i].ends_with("|>")))
      throw InputError(cat(where, ": token \"", printable(bytes_to_vocab_text(tokens[i]).substr(0, 40)), "\" (id ", i,
                           ") is not a byte, no merge makes it, and it is not a special token <|...|>: the merges are "
                           "incomplete"));
    specials.push_back(static_cast<int32_t>(i));
  }
  return specials;
}

nlohmann::json parse_json_text(std::string_view text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(cat(where, ": not valid JSON (", e.what(), ")"));
  }
}

std::shared_ptr<const Tokenizer::Vocab> parse_gpt2(std::string_view encoder_json, std::string_view text,
                                                   const std::string& enc, const std::string& bpe) {
  std::vector<std::string> tokens = tokens_of(parse_json_text(encoder_json, enc), enc);
  MergeReader reader(tokens);
  std::vector<std::pair<int32_t, int32_t>> merges;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || line.find(' ', space + 1) != std::string_view::npos ||
        space + 1 == line.size())
      throw InputError(cat(bpe, ":", line_no, ": expected a merge \"A B\" (two tokens and one space), got \"",
                           printable(line.substr(0, 80)), "\""));
    merges.push_back(reader.pair(line.substr(0, space), line.substr(space + 1), cat(bpe, ":", line_no)));
  }
  const std::vector<int32_t> specials = specials_of(tokens, merges, cat(enc, " and ", bpe));
  return finish_vocab(std::move(tokens), merges, specials, cat(enc, " and ", bpe));
}

}  // namespace

std::shared_ptr<const Tokenizer::Vocab> load_gpt2_dir(const std::string& dir) {
  const std::string enc = (fs::path(dir) / "encoder.json").string(), bpe = (fs::path(dir) / "vocab.bpe").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(cat(dir, ": not a directory (a tokenizer directory holds encoder.json and vocab.bpe)"));
  return parse_gpt2(read_file(enc, size_t{1} << 30), read_file(bpe, size_t{1} << 30), enc, bpe);
}

std::shared_ptr<const Tokenizer::Vocab> parse_hf(std::string_view text, const std::string& path) {
  const nlohmann::json j = parse_json_text(text, path);
  auto fail = [&](const std::string& what) { return InputError(cat(path, ": ", what)); };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) throw fail("expected a tokenizer.json with a \"model\" object");
  const auto& m = j["model"];
  if (string_or_empty(m, "type") != "BPE")
    throw fail(cat("model type \"", printable(string_or_empty(m, "type")), "\": only byte-level BPE (GPT-2's kind) is supported"));
  const auto is_byte_level = [](const nlohmann::json& p) {
    if (!p.is_object()) return false;
    if (string_or_empty(p, "type") == "ByteLevel") return true;
    if (string_or_empty(p, "type") != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array()) return false;
    for (const auto& q : p["pretokenizers"])
      if (q.is_object() && string_or_empty(q, "type") == "ByteLevel") return true;
    return false;
  };
  if (!j.contains("pre_tokenizer") || !is_byte_level(j["pre_tokenizer"]))
    throw fail("pre_tokenizer is not ByteLevel: only byte-level BPE (GPT-2's kind) is supported");
  if (!m.contains("vocab") || !m.contains("merges") || !m["merges"].is_array())
    throw fail("expected model.vocab (an object) and model.merges (an array)");
  std::vector<std::string> tokens = tokens_of(m["vocab"], cat(path, ": model.vocab"));
  MergeReader reader(tokens);
  std::vector<std::pair<int32_t, int32_t>> merges;
  for (size_t i = 0; i < m["merges"].size(); ++i) {
    const auto& e = m["merges"][i];
    const std::string where = cat(path, ": model.merges[", i, "]");
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
        throw InputError(cat(where, ": expected \"A B\", got \"", printable(s.substr(0, 80)), "\""));
      merges.push_back(reader.pair(std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1), where));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.push_back(reader.pair(e[0].get<std::string>(), e[1].get<std::string>(), where));
    } else {
      throw InputError(cat(where, ": expected \"A B\" or [\"A\", \"B\"]"));
    }
  }
  std::vector<int32_t> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        throw fail("added_tokens: expected objects with an integer id and a string content");
      const auto id = a["id"].get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(tokens.size()))
        throw fail(cat("added_tokens: id ", id, " is outside model.vocab (", tokens.size(), " tokens)"));
      tokens[id] = a["content"].get<std::string>();
      added.push_back(static_cast<int32_t>(id));
    }
  }
  std::vector<int32_t> specials = specials_of(tokens, merges, path, added);
  for (int32_t id : added)
    if (std::find(specials.begin(), specials.end(), id) == specials.end()) specials.push_back(id);
  return finish_vocab(std::move(tokens), merges, specials, path);
}


Tokenizer Tokenizer::parse_gpt2_files(std::string_view encoder_json, std::string_view vocab_bpe,
                                      const std::string& where, std::string spec) {
  return from_vocab(parse_gpt2(encoder_json, vocab_bpe, where + "/encoder.json", where + "/vocab.bpe"), std::move(spec));
}

Tokenizer Tokenizer::parse_hf_json(std::string_view tokenizer_json, const std::string& where) {
  return from_vocab(parse_hf(tokenizer_json, where), "hf:" + where);
}

std::string Tokenizer::hf_json() const {
  LOOM_CHECK(vocab_ != nullptr);
  const Vocab& v = *vocab_;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object(), merges = nlohmann::ordered_json::array(),
                         added = nlohmann::ordered_json::array();
  std::vector<bool> special(v.tokens.size(), false);
  for (int32_t s : v.specials) {
    special[s] = true;
    added.push_back({{"id", s}, {"content", v.tokens[s]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) vocab[special[id] ? v.tokens[id] : bytes_to_vocab_text(v.tokens[id])] = id;
  for (const auto& [a, b] : v.merges) merges.push_back(bytes_to_vocab_text(v.tokens[a]) + " " + bytes_to_vocab_text(v.tokens[b]));
  const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                             {"use_regex", true}};
  const nlohmann::ordered_json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}, {"normalizer", nullptr},
      {"pre_tokenizer", byte_level}, {"post_processor", byte_level}, {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                 {"merges", merges}}}};
  return j.dump(2);
}

std::pair<std::string, std::string> Tokenizer::files() const {
  LOOM_CHECK(vocab_ != nullptr);
  const Vocab& v = *vocab_;
  nlohmann::ordered_json enc = nlohmann::ordered_json::object();
  std::vector<bool> special(v.tokens.size(), false);
  for (int32_t s : v.specials) special[s] = true;
  for (size_t id = 0; id < v.tokens.size(); ++id)
    enc[special[id] ? v.tokens[id] : bytes_to_vocab_text(v.tokens[id])] = id;
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) merges += bytes_to_vocab_text(v.tokens[a]) + " " + bytes_to_vocab_text(v.tokens[b]) + "\n";
  return {enc.dump(), merges};
}

bool Tokenizer::save(const std::string& dir) const {
  if (!vocab_) return false;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(cat(dir, ": cannot create the tokenizer directory (", ec.message(), ")"));
  const auto [encoder, merges] = files();
  write_file_atomic((fs::path(dir) / "encoder.json").string(), encoder);
  write_file_atomic((fs::path(dir) / "vocab.bpe").string(), merges);
  return true;
}


}  // namespace loom::data
