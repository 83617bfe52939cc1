// Hostile input for datasets and tokenizers (issue 43, item 6; the harness and what every
// run must hold: tests/support/hostile_fixture.h): a dataset manifest's fields, a shard's
// bytes (its header, its tokens: the SHA-256 rank 0 checks), its document index, a
// manifest of 10^6 shards,
// and a tokenizer's encoder.json and vocab.bpe. Each variant is made in a fresh copy of a
// run holding a dataset and a tokenizer; `loom train` on the dataset and `loom data fetch`
// on its manifest, or `loom tokenizer encode` and `loom data prepare` with the tokenizer,
// run on it and must end within the bound with one line naming a file of the input, and
// a refused input leaves every file as it was (nothing is written to the run directory
// the variant's training would have made).
#include <filesystem>

#include <nlohmann/json.hpp>

#include "hostile_fixture.h"
#include "loom/core/sha256.h"
#include "loom/data/dataset.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using hostile::HostileInput;
using hostile::Variant;

class HostileData : public HostileInput {
 protected:
  void SetUp() override {
    HostileInput::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    fs::create_directories(p("dtext"));
    std::string text;
    for (int i = 0; i < 300; ++i) text += cat("Line ", i, ": the quick brown fox jumps over the lazy dog.\n");
    write(p("dtext/a.txt"), text);
    // Made outside (no command writes into a run directory), then copied in.
    ASSERT_EQ(loom(cat("data prepare text:", p("dtext"), " --out ", p("ds"), " --shard-tokens 4000")).code, 0);
    ASSERT_EQ(loom(cat("tokenizer train text:", p("dtext"), " --vocab-size 300 --out ", p("tok"))).code, 0);
    fs::copy(p("ds"), p("runs/base/ds"), fs::copy_options::recursive);
    fs::copy(p("tok"), p("runs/base/tok"), fs::copy_options::recursive);
  }
  std::vector<std::string> dataset_commands(const std::string& run) const {
    return {cat("train ", p("nano.toml"), " --quiet --job.run_dir=", run, "/out --job.name=t --data.train=", run,
                "/ds/train.json --data.val= --training.steps=1 --checkpoint.every=0"),
            cat("data fetch ", run, "/ds/train.json --cache-dir ", run, "/cache")};
  }
  std::vector<std::string> tokenizer_commands(const std::string& run) const {
    return {cat("tokenizer encode --tokenizer ", run, "/tok ", p("dtext/a.txt")),
            cat("data prepare text:", p("dtext"), " --tokenizer ", run, "/tok --out ", run, "/p.bin")};
  }
};

TEST_F(HostileData, ManifestsAndShards) {
  std::vector<Variant> all = json_variants("manifest", "ds/train.json", /*rehash=*/false);
  const std::string shard = "ds/train-000001.bin";
  const auto size = static_cast<size_t>(fs::file_size(p("runs/base/" + shard)));
  // The header's fields, the first and last tokens; a flip anywhere changes the SHA-256.
  for (Variant& v : byte_variants("shard", shard, {4, 8, 12, 1024, 1026, size - 2}, 0, size, 16, /*flips_must_fail=*/true))
    all.push_back(std::move(v));
  const json manifest = json::parse(read_file(p("runs/base/ds/train.json")));
  all.push_back({"manifest", "10^6 shards, each the same file", [=](const std::string& root) {
                   json m = manifest;
                   const json one = m["shards"][0];
                   m["shards"] = json::array();
                   for (int i = 0; i < 1000000; ++i) m["shards"].push_back(one);
                   write(root + "/ds/train.json", m.dump());
                 }, /*must_fail=*/false});
  all.push_back({"manifest", "10^6 shards, the last one missing", [=](const std::string& root) {
                   json m = manifest;
                   const json one = m["shards"][0];
                   m["shards"] = json::array();
                   for (int i = 0; i < 1000000; ++i) m["shards"].push_back(one);
                   m["shards"].back()["path"] = "nowhere.bin";
                   write(root + "/ds/train.json", m.dump());
                 }});
  all.push_back({"manifest", "every shard empty", [=](const std::string& root) {
                   json m = manifest;
                   for (json& s : m["shards"]) s["tokens"] = 0;
                   write(root + "/ds/train.json", m.dump());
                 }});
  run_all(all, [&](const std::string& run, const std::string&) { return dataset_commands(run); },
          [](const std::string& run) { return run; });
}

// A shard's document index (data.windows = "documents"): its bytes (every flip changes
// the SHA-256 the manifest lists), the file gone, and an index whose manifest entry was
// rewritten to match it but whose offsets leave the shard.
TEST_F(HostileData, DocumentIndexes) {
  const std::string index = "ds/train-000000.bin.idx";
  const auto size = static_cast<size_t>(fs::file_size(p("runs/base/" + index)));
  std::vector<Variant> all = byte_variants("index", index, {4, 8, 12, 1024, size - 2}, 0, size, 40, /*flips_must_fail=*/true);
  all.push_back({"index", "the index removed", [=](const std::string& root) { fs::remove(root + "/" + index); }});
  const json manifest = json::parse(read_file(p("runs/base/ds/train.json")));
  all.push_back({"index", "offsets past the shard's end, the manifest rehashed to match", [=](const std::string& root) {
                   std::string bytes = read_file(root + "/" + index);
                   const int32_t header[3] = {data::kIndexMagic, 1, 2};
                   const uint32_t starts[2] = {0, 1u << 30};
                   bytes.replace(0, sizeof header, reinterpret_cast<const char*>(header), sizeof header);
                   bytes.resize(1024);
                   bytes.append(reinterpret_cast<const char*>(starts), sizeof starts);
                   write(root + "/" + index, bytes);
                   json m = manifest;
                   m["shards"][0]["documents"] = 2;
                   m["shards"][0]["index_sha256"] = sha256_hex(bytes);
                   write(root + "/ds/train.json", m.dump());
                 }});
  run_all(all, [&](const std::string& run, const std::string&) {
            std::vector<std::string> commands = dataset_commands(run);
            commands[0] += " --data.windows=documents";
            return commands;
          },
          [](const std::string& run) { return run; });
}

TEST_F(HostileData, TokenizerFiles) {
  std::vector<Variant> all = json_variants("encoder.json", "tok/encoder.json", /*rehash=*/false);
  const std::string merges = read_file(p("runs/base/tok/vocab.bpe"));
  std::vector<size_t> lines;
  for (size_t i = 0; i + 1 < merges.size(); ++i)  // (cutting the last newline leaves it valid)
    if (merges[i] == '\n' || merges[i] == ' ') lines.push_back(i);
  for (Variant& v : byte_variants("vocab.bpe", "tok/vocab.bpe", lines, 0, merges.size(), 16, /*flips_must_fail=*/false))
    all.push_back(std::move(v));
  const std::string encoder = read_file(p("runs/base/tok/encoder.json"));
  for (Variant& v : byte_variants("encoder.json", "tok/encoder.json", hostile::json_boundaries(encoder), 0, encoder.size(),
                                  16, /*flips_must_fail=*/false))
    all.push_back(std::move(v));
  all.push_back({"vocab.bpe", "a merge of a token with itself repeated 10^5 times", [=](const std::string& root) {
                   std::string m = merges;
                   for (int i = 0; i < 100000; ++i) m += "a b\n";
                   write(root + "/tok/vocab.bpe", m);
                 }, /*must_fail=*/false});
  run_all(all, [&](const std::string& run, const std::string&) { return tokenizer_commands(run); },
          [](const std::string& run) { return run; });
}

}  // namespace
}  // namespace loom
