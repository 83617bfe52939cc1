// Sharded datasets: prepare's shards and manifests, their checks, windows across shards,
// more than 2^32 tokens, the table-free shuffle, and the prefetcher.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/data.h"
#include "loom/data/dataset.h"
#include "loom/data/prefetch.h"
#include "loom/data/tokenizer.h"
#include "loom_testing.h"

namespace loom::data {
namespace {
namespace fs = std::filesystem;
using loom::testing::expect_input_error;

class DatasetTest : public loom::testing::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& bytes) const {
    fs::create_directories(fs::path(path(name)).parent_path());
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  // Three text files of distinct lines.
  void write_corpus() const {
    for (int f = 0; f < 3; ++f) {
      std::string text;
      for (int i = 0; i < 200; ++i) text += cat("file ", f, " line ", i, ": the quick brown fox.\n");
      write(cat("src/", f, ".txt"), text);
    }
  }
};

TEST_F(DatasetTest, PrepareWritesShardsAndManifestsThatMatchTheOneFileOutput) {
  write_corpus();
  const Tokenizer bytes = Tokenizer::bytes();
  const PrepareResult one = prepare_text({.sources = {"text:" + path("src")}, .out = path("one.bin"), .val_fraction = 0.1}, bytes);
  const PrepareResult many = prepare_text(
      {.sources = {"text:" + path("src")}, .out = path("ds"), .val_fraction = 0.1, .sharded = true, .shard_tokens = 5000, .threads = 2}, bytes);
  EXPECT_EQ(many.train_path, path("ds/train.json"));
  EXPECT_EQ(many.train_tokens, one.train_tokens);
  EXPECT_EQ(many.val_tokens, one.val_tokens);
  const Manifest m = read_manifest(many.train_path);
  ASSERT_GT(m.shards.size(), 2u);
  EXPECT_EQ(static_cast<int64_t>(m.shards.size()), (one.train_tokens + 4999) / 5000);
  EXPECT_EQ(m.tokens, one.train_tokens);
  EXPECT_EQ(m.vocab_size, 256);
  // The shards joined are the one file's tokens.
  std::vector<uint16_t> joined;
  for (const ShardInfo& s : m.shards) {
    check_shard(s, m.path, /*hash=*/true);
    const std::vector<uint16_t> t = read_tokens(s.path);
    joined.insert(joined.end(), t.begin(), t.end());
  }
  EXPECT_EQ(joined, read_tokens(one.train_path));
  // A second prepare into the same directory is refused; nothing is written over.
  expect_input_error([&] { prepare_text({.sources = {"text:" + path("src")}, .out = path("ds"), .sharded = true}, bytes); },
                     {"already holds a dataset (train.json)"});
}

TEST_F(DatasetTest, ShardsThatDisagreeWithTheManifestAreNamed) {
  write_corpus();
  prepare_text({.sources = {"text:" + path("src")}, .out = path("ds"), .sharded = true, .shard_tokens = 4000}, Tokenizer::bytes());
  const Manifest m = read_manifest(path("ds/train.json"));
  const ShardInfo& s = m.shards[1];
  {  // a byte changed: the size and header agree, the hash does not
    std::fstream f(s.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('#');
  }
  EXPECT_NO_THROW(check_shard(s, m.path, false));
  expect_input_error([&] { check_shard(s, m.path, true); }, {"train-000001.bin", "SHA-256", "the manifest says"});
  ::truncate(s.path.c_str(), 1500);
  expect_input_error([&] { check_shard(s, m.path, false); }, {"train-000001.bin", "1500 bytes, but the manifest says 4000 uint16 tokens (9024 bytes)"});
  // The manifest's own fields.
  auto manifest = [&](const std::string& body) {
    write("m.json", body);
    return path("m.json");
  };
  expect_input_error([&] { read_manifest(manifest("[1]")); }, {"m.json: expected a JSON object"});
  expect_input_error([&] { read_manifest(manifest(R"({"format": "x", "version": 1})")); }, {"format: expected \"loom-dataset\""});
  expect_input_error([&] { read_manifest(manifest(R"({"format": "loom-dataset", "version": 1, "shards": []})")); },
                     {"shards: expected a non-empty array"});
  const std::string sha(64, 'a');
  expect_input_error([&] {
    read_manifest(manifest(cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "url": "http://x/a", "tokens": 1, "dtype": "uint16", "sha256": ")", sha, R"("}]})")));
  }, {"shards[0]: expected one of \"path\" and \"url\""});
  expect_input_error([&] {
    read_manifest(manifest(cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "tokens": -1, "dtype": "uint16", "sha256": ")", sha, R"("}]})")));
  }, {"shards[0].tokens: expected an integer in [0, 2147483647]"});
  expect_input_error([&] {
    read_manifest(manifest(cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "tokens": 1, "dtype": "int8", "sha256": ")", sha, R"("}]})")));
  }, {"shards[0].dtype: expected \"uint16\" or \"uint32\""});
  expect_input_error([&] {
    read_manifest(manifest(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "tokens": 1, "dtype": "uint16", "sha256": "00"}]})"));
  }, {"shards[0].sha256: expected 64 lowercase hex digits"});
  expect_input_error([&] {
    read_manifest(manifest(cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"url": "ftp://x/a", "tokens": 1, "dtype": "uint16", "sha256": ")", sha, R"("}]})")));
  }, {"shards[0].url: expected an http:// or https:// URL"});
}

TEST_F(DatasetTest, WindowsRunShardAfterShardAndCheckTheVocabulary) {
  write_corpus();
  prepare_text({.sources = {"text:" + path("src")}, .out = path("ds"), .sharded = true, .shard_tokens = 3000}, Tokenizer::bytes());
  const Manifest m = read_manifest(path("ds/train.json"));
  const int64_t t = 64;
  ShardedWindows w(m, t, 256);
  EXPECT_EQ(w.order(), Order::kFeistel);
  int64_t expected = 0;
  for (const ShardInfo& s : m.shards) expected += (s.tokens - 1) / t;
  ASSERT_EQ(w.size(), expected);
  EXPECT_EQ(w.shards_mapped(), 0) << "nothing is mapped before it is read";
  // Window (first of shard 1) is shard 1's tokens [0, 65).
  const int64_t first_of_1 = (m.shards[0].tokens - 1) / t;
  const Batch b = w.batch(std::vector<int64_t>{first_of_1, 0});
  const std::vector<uint16_t> s1 = read_tokens(m.shards[1].path);
  for (int64_t j = 0; j < t; ++j) {
    EXPECT_EQ(b.inputs.data<int32_t>()[j], s1[static_cast<size_t>(j)]);
    EXPECT_EQ(b.targets.data<int32_t>()[j], s1[static_cast<size_t>(j + 1)]);
  }
  EXPECT_EQ(w.shards_mapped(), 2);
  ShardedWindows small(m, t, 100);  // the corpus holds ids up to 'x' = 120
  expect_input_error([&] { small.batch(std::vector<int64_t>{0}); }, {"train-000000.bin", "outside the model's vocabulary (model.vocab_size = 100)"});
}

TEST_F(DatasetTest, DocumentWindowsStartAtEachDocumentAndGoOnThroughLongOnes) {
  // 2,000 JSONL documents of 1-80 bytes, one in eight of 100-300 (longer than a window),
  // bytes tokenizer: the token stream is the documents' bytes one after another.
  std::string jsonl;
  std::vector<int64_t> starts;  // each document's first token in the whole stream
  int64_t at = 0;
  uint32_t x = 12345;
  for (int d = 0; d < 2000; ++d) {
    x = x * 1664525u + 1013904223u;
    const int64_t len = (x >> 8) % 8 == 0 ? 100 + (x >> 12) % 201 : 1 + (x >> 12) % 80;
    std::string text = cat("d", d, ":");
    while (static_cast<int64_t>(text.size()) < len) text += static_cast<char>('a' + text.size() % 26);
    text.resize(static_cast<size_t>(len));
    jsonl += cat("{\"text\": \"", text, "\"}\n");
    starts.push_back(at);
    at += len;
  }
  write("docs.jsonl", jsonl);
  prepare_text({.sources = {"jsonl:" + path("docs.jsonl")}, .out = path("ds"), .val_fraction = 0, .sharded = true,
                .shard_tokens = 20000}, Tokenizer::bytes());
  const Manifest m = read_manifest(path("ds/train.json"));
  ASSERT_GE(m.shards.size(), 4u);
  ASSERT_EQ(m.tokens, at);
  EXPECT_TRUE(check_local_shards(m, /*hash=*/true, /*indexes=*/true) == false);
  EXPECT_NE(manifest_json(m).find("\"index_sha256\""), std::string::npos);
  // The reference: each shard's segment starts (0 and every document starting in it), a
  // window at start + kT while inside the segment and T + 1 tokens fit in the shard.
  const int64_t t = 32;
  std::vector<std::pair<size_t, int64_t>> expected;  // (shard, offset), in order
  int64_t first = 0, docs = 0;
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const int64_t n = m.shards[s].tokens;
    std::vector<int64_t> seg = {0};
    for (int64_t g : starts)
      if (g > first && g < first + n) seg.push_back(g - first);
    EXPECT_EQ(m.shards[s].documents, static_cast<int64_t>(seg.size())) << "shard " << s;
    docs += static_cast<int64_t>(seg.size());
    for (size_t i = 0; i < seg.size(); ++i) {
      const int64_t end = i + 1 < seg.size() ? seg[i + 1] : n;
      for (int64_t o = seg[i]; o < end && o + t < n; o += t) expected.emplace_back(s, o);
    }
    first += n;
  }
  EXPECT_GT(m.shards[0].documents, 128) << "a shard of several 64-document blocks";
  EXPECT_GE(docs, 2000);
  EXPECT_LE(docs, 2000 + static_cast<int64_t>(m.shards.size()) - 1) << "every document, and a carried-over start per shard";
  ShardedWindows w(m, t, 256, nullptr, Windows::kDocuments);
  ASSERT_EQ(w.size(), static_cast<int64_t>(expected.size()));
  std::vector<int64_t> all(expected.size());
  std::iota(all.begin(), all.end(), 0);
  const Batch b = w.batch(all);
  std::vector<std::vector<uint16_t>> shard_tokens;
  for (const ShardInfo& s : m.shards) shard_tokens.push_back(read_tokens(s.path));
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [s, o] = expected[i];
    for (int64_t j = 0; j < t; ++j) {
      ASSERT_EQ(b.inputs.data<int32_t>()[static_cast<int64_t>(i) * t + j], shard_tokens[s][static_cast<size_t>(o + j)]) << "window " << i;
      ASSERT_EQ(b.targets.data<int32_t>()[static_cast<int64_t>(i) * t + j], shard_tokens[s][static_cast<size_t>(o + j + 1)]) << "window " << i;
    }
  }
  // Every document with room for a window begins one, and its first token is the 'd' of "d<k>:".
  int64_t began = 0;
  for (size_t i = 0; i < expected.size(); ++i) began += b.inputs.data<int32_t>()[static_cast<int64_t>(i) * t] == 'd';
  EXPECT_GE(began, 1990);

  // A manifest without indexes cannot make document windows; a broken index is named.
  Manifest bare = m;
  for (ShardInfo& s : bare.shards) s.documents = -1;
  write("bare.json", manifest_json(bare));
  const Manifest bare_read = read_manifest(path("bare.json"));
  expect_input_error([&] { ShardedWindows(bare_read, t, 256, nullptr, Windows::kDocuments); },
                     {"bare.json: shards[0] (", "has no document index"});
  expect_input_error([&] { check_local_shards(bare_read, false, true); }, {"has no document index"});
  EXPECT_NO_THROW(ShardedWindows(bare_read, t, 256));
  const std::string idx = m.shards[1].path + ".idx";
  {  // document 2 moved before document 1
    std::fstream f(idx, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 2 * 4);
    const uint32_t one = 1;
    f.write(reinterpret_cast<const char*>(&one), 4);
  }
  expect_input_error([&] { check_local_shards(m, true, true); }, {"train-000001.bin.idx", "SHA-256"});
  expect_input_error([&] { ShardedWindows(m, t, 256, nullptr, Windows::kDocuments); },
                     {"train-000001.bin.idx", "document 1 starts at token", "expected offsets strictly increasing from 0"});
  {  // document 1 at 0 as well: an empty document 0
    std::fstream f(idx, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 1 * 4);
    const uint32_t zero = 0;
    f.write(reinterpret_cast<const char*>(&zero), 4);
  }
  expect_input_error([&] { ShardedWindows(m, t, 256, nullptr, Windows::kDocuments); },
                     {"train-000001.bin.idx", "document 0 starts at token 0, the next at 0"});
  ::truncate(idx.c_str(), 1030);
  expect_input_error([&] { ShardedWindows(m, t, 256, nullptr, Windows::kDocuments); },
                     {"train-000001.bin.idx", "1030 bytes, but the manifest says", "documents"});
  write("m.json", cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "tokens": 5, "dtype": "uint16", "sha256": ")",
                      std::string(64, 'a'), R"(", "documents": 2}]})"));
  expect_input_error([&] { read_manifest(path("m.json")); }, {"shards[0]: expected both of \"documents\" and \"index_sha256\""});
  write("m.json", cat(R"({"format": "loom-dataset", "version": 1, "shards": [{"path": "a.bin", "tokens": 5, "dtype": "uint16", "sha256": ")",
                      std::string(64, 'a'), R"(", "documents": 6, "index_sha256": ")", std::string(64, 'b'), R"("}]})"));
  expect_input_error([&] { read_manifest(path("m.json")); }, {"shards[0].documents: expected an integer in [1, 5]"});
}

TEST_F(DatasetTest, MoreThanTwoToTheThirtyTwoTokensInSparseShards) {
  // Three shards of 2^31 - 1 uint16 tokens each (sparse files: 4 GiB apiece, none of it on
  // disk), 6.4e9 tokens in all; the last shard's last window holds tokens written at its end.
  const int64_t count = INT32_MAX;
  Manifest m{.path = path("big.json")};
  for (int s = 0; s < 3; ++s) {
    ShardInfo info{.location = cat("s", s, ".bin"), .path = path(cat("s", s, ".bin")), .tokens = count, .dtype_bytes = 2,
                   .sha256 = std::string(64, '0')};
    const int fd = ::open(info.path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    int32_t header[256] = {kTokenMagic, 1, static_cast<int32_t>(count)};
    ASSERT_EQ(::pwrite(fd, header, sizeof header, 0), static_cast<ssize_t>(sizeof header));
    if (s == 2) {
      const uint16_t tail[3] = {7, 8, 9};
      ASSERT_EQ(::pwrite(fd, tail, sizeof tail, info.bytes() - 6), 6);
    }
    ASSERT_EQ(::ftruncate(fd, info.bytes()), 0);
    ::close(fd);
    check_shard(info, m.path, /*hash=*/false);
    m.tokens += count;
    m.shards.push_back(info);
  }
  EXPECT_GT(m.tokens, int64_t{1} << 32);
  write_file_atomic(m.path, manifest_json(m));
  const Manifest again = read_manifest(m.path);
  EXPECT_EQ(again.tokens, 3 * count);
  const int64_t t = 2;
  ShardedWindows w(again, t, 256);
  EXPECT_EQ(w.size(), 3 * ((count - 1) / t));
  const Batch b = w.batch(std::vector<int64_t>{w.size() - 1});  // tokens [count - 3, count) of shard 2
  EXPECT_EQ(b.inputs.data<int32_t>()[0], 7);
  EXPECT_EQ(b.inputs.data<int32_t>()[1], 8);
  EXPECT_EQ(b.targets.data<int32_t>()[1], 9);
  EXPECT_EQ(w.shards_mapped(), 1);
  // The shuffle draws from all 3.2e9 windows without a table: about a third lie past 2^31.
  Sampler order(w.size(), 5, Order::kFeistel);
  int64_t past = 0;
  for (int64_t g = 0; g < 1000; ++g) past += order.item(g) > (int64_t{1} << 31);
  EXPECT_GT(past, 250);
  EXPECT_LT(past, 420);
}

TEST(FeistelOrder, EachEpochIsAPermutationAndEpochsDiffer) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 12345}) {
    Sampler s(n, 42, Order::kFeistel), again(n, 42, Order::kFeistel), other(n, 43, Order::kFeistel);
    std::set<int64_t> seen;
    int64_t same_as_other = 0, same_next_epoch = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t x = s.item(i);
      ASSERT_GE(x, 0);
      ASSERT_LT(x, n);
      seen.insert(x);
      EXPECT_EQ(again.item(i), x);
      same_as_other += other.item(i) == x;
      same_next_epoch += s.item(n + i) == x;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
    if (n >= 64) {
      EXPECT_LT(same_as_other, n / 8) << n;
      EXPECT_LT(same_next_epoch, n / 8) << n;
    }
  }
}

TEST_F(DatasetTest, JsonlAndGlobSourcesEachDocumentEndingWithEndOfText) {
  write("j/a.jsonl", "{\"text\": \"hello world\"}\n{\"text\": \"second doc\", \"id\": 2}\n");
  write("j/b.jsonl", "{\"body\": \"other field\"}\n");
  const Tokenizer t = train_bpe(std::vector<std::string>{"hello world second doc other field"}, {.vocab_size = 270}).tokenizer;
  const PrepareResult r = prepare_text({.sources = {"jsonl:" + path("j/a.jsonl")}, .out = path("a.bin"), .val_fraction = 0}, t);
  const std::vector<uint16_t> ids = read_tokens(r.train_path);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), t.end_of_text()), 2) << "one <|endoftext|> after each document";
  Tokenizer copy = t;
  std::vector<int32_t> wide(ids.begin(), ids.end());
  EXPECT_EQ(copy.decode(wide), "hello world<|endoftext|>second doc<|endoftext|>");
  const PrepareResult g = prepare_text({.sources = {"jsonl:" + path("j/b.jsonl") + ":body"}, .out = path("b.bin"), .val_fraction = 0}, t);
  EXPECT_GT(g.train_tokens, 3);
  expect_input_error([&] { prepare_text({.sources = {"jsonl:" + path("j/b.jsonl")}, .out = path("c.bin")}, t); },
                     {"b.jsonl:1: expected a JSON object with a string field \"text\""});
  write("j/bad.jsonl", "{\"text\": \"ok\"}\nnot json\n");
  expect_input_error([&] { prepare_text({.sources = {"jsonl:" + path("j/bad.jsonl")}, .out = path("d.bin")}, t); },
                     {"bad.jsonl:2: not a JSON object"});
  write_corpus();
  const PrepareResult globbed = prepare_text({.sources = {"text:" + path("src/[01].txt")}, .out = path("e.bin")}, Tokenizer::bytes());
  EXPECT_EQ(globbed.files, 2);
  expect_input_error([&] { prepare_text({.sources = {"text:" + path("src/*.md")}, .out = path("f.bin")}, Tokenizer::bytes()); },
                     {"the pattern matches no file"});
}

TEST(Prefetch, BatchesComeInOrderAheadOfTheirStepAndErrorsArriveWithTheirBatch) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 250);
  const TokenWindows w(tokens, 10);  // 99 windows
  auto items_of = [](int64_t n) { return std::vector<int64_t>{(n * 2) % 99, (n * 2 + 1) % 99}; };
  Prefetcher p(w, items_of, 3, 4);
  double waited = 0;
  for (int64_t n = 3; n < 30; ++n) {
    const Batch got = p.take(n, &waited), direct = w.batch(items_of(n));
    ASSERT_EQ(0, std::memcmp(got.inputs.raw(), direct.inputs.raw(), direct.inputs.nbytes())) << n;
    ASSERT_EQ(0, std::memcmp(got.targets.raw(), direct.targets.raw(), direct.targets.nbytes())) << n;
  }
  // Skipping ahead, and going back to one the reader has passed.
  const Batch ahead = p.take(50, &waited), back = p.take(40, &waited);
  EXPECT_EQ(ahead.inputs.data<int32_t>()[0], w.batch(items_of(50)).inputs.data<int32_t>()[0]);
  EXPECT_EQ(back.inputs.data<int32_t>()[0], w.batch(items_of(40)).inputs.data<int32_t>()[0]);
  EXPECT_GE(waited, 0);
  // A reader's error comes with the batch it was making.
  Prefetcher failing(w, [](int64_t n) {
    if (n == 2) throw InputError("shard x: bad");
    return std::vector<int64_t>{n};
  }, 0, 2);
  EXPECT_NO_THROW(failing.take(0, nullptr));
  EXPECT_NO_THROW(failing.take(1, nullptr));
  EXPECT_THROW(failing.take(2, nullptr), InputError);
}

}  // namespace
}  // namespace loom::data
