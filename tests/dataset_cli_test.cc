// Sharded datasets as a user meets them (docs/data.md): `loom data prepare --out DIR` writes
// shards and manifests; training on a manifest resumes on another layout at exactly the
// next window; a shard that disagrees with its manifest is refused before the run
// directory is touched; the step's data wait is in metrics.jsonl; document windows
// (data.windows = "documents") resume the same way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_fixture.h"
#include "loom/core/fileio.h"
#include "loom/data/dataset.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

class Dataset : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    fs::create_directories(p("text"));
    for (int f = 0; f < 3; ++f) {
      std::string text;
      for (int i = 0; i < 150; ++i) text += cat("File ", f, ", line ", i, ": the quick brown fox jumps over the lazy dog.\n");
      write(p(cat("text/", f, ".txt")), text);
    }
    const Result r = loom(cat("data prepare text:", p("text"), " --out ", p("ds"), " --shard-tokens 4000"));
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_NE(r.out.find("shards"), std::string::npos) << r.out;
    data_ = cat(" --data.train=", p("ds/train.json"), " --data.val=", p("ds/val.json"));
    det_ = cat(" --quiet --parallel.deterministic=true", data_);
  }
  // Each metrics line up to its tokens field, with its val_loss: what must be equal bitwise.
  std::vector<std::string> losses(const std::string& run) const {
    std::vector<std::string> out;
    std::istringstream in(read_file(p("runs/" + run + "/metrics.jsonl")));
    for (std::string line; std::getline(in, line);) {
      std::string keep = line.substr(0, line.find(", \"tokens\""));
      if (const auto v = line.find("\"val_loss\""); v != std::string::npos) keep += line.substr(v, line.find_first_of(",}", v) - v);
      out.push_back(keep);
    }
    return out;
  }
  // A run of 6 steps (job "one"), and the same on two data-parallel ranks for 3 steps and
  // one process from step 3 (job "cut"): the same losses and weights, bit for bit.
  void expect_resume_on_another_layout(const std::string& flags) {
    const std::string det = det_ + flags;
    ASSERT_EQ(loom(cat("train ", p("nano.toml"), det, " --job.name=one")).code, 0);
    Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), det, " --job.name=cut"));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    fs::remove_all(p("runs/cut/checkpoints/step_6"));
    write(p("runs/cut/checkpoints/latest"), "step_3\n");
    r = loom(cat("train ", p("nano.toml"), det, " --job.name=cut --resume"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto one = losses("one");
    ASSERT_EQ(one.size(), 6u);
    EXPECT_EQ(one, losses("cut"));
    EXPECT_EQ(logical(p("runs/one/checkpoints/step_6"), checkpoint::Part::kModel),
              logical(p("runs/cut/checkpoints/step_6"), checkpoint::Part::kModel));
  }
  std::string data_, det_;
};

TEST_F(Dataset, AManifestRunResumesOnAnotherLayoutAtTheNextWindow) {
  const data::Manifest m = data::read_manifest(p("ds/train.json"));
  EXPECT_GE(m.shards.size(), 3u);
  expect_resume_on_another_layout(" --data.windows=tokens");
  // The same run without prefetch: the same bits; every step says how long it waited.
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), det_, " --job.name=sync --data.prefetch=0")).code, 0);
  EXPECT_EQ(losses("one"), losses("sync"));
  EXPECT_NE(read_file(p("runs/one/metrics.jsonl")).find("\"data_wait_ms\": "), std::string::npos);
}

TEST_F(Dataset, DocumentWindowsResumeOnAnotherLayoutToo) {
  expect_resume_on_another_layout(" --data.windows=documents");
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), det_, " --job.name=tokens")).code, 0);
  EXPECT_NE(losses("one"), losses("tokens")) << "document windows are other windows";
  // One token file has no index; an unknown mode is named.
  const std::string one_file = cat(" --data.train=", p("ds/train-000000.bin"), " --data.val=");
  Result r = loom(cat("train ", p("nano.toml"), det_, one_file, " --job.name=f --data.windows=documents"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("train-000000.bin: one token file has no document index"), std::string::npos) << r.err;
  r = loom(cat("train ", p("nano.toml"), det_, " --job.name=f --data.windows=lines"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("= \"lines\": expected \"tokens\" or \"documents\""), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("runs/f")));
}

TEST_F(Dataset, AShardThatDisagreesWithItsManifestIsRefusedBeforeTheRunDirectory) {
  const data::Manifest m = data::read_manifest(p("ds/train.json"));
  {
    std::fstream f(m.shards[1].path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1500);
    f.put('~');
  }
  Result r = loom(cat("train ", p("nano.toml"), " --quiet", data_));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("train-000001.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the shard is not the one listed"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_FALSE(fs::exists(p("runs/r"))) << "nothing written";
  // data.verify = "size" takes the shard as its size and header say (the user's choice).
  r = loom(cat("train ", p("nano.toml"), " --quiet --training.steps=1", data_, " --data.verify=size"));
  EXPECT_EQ(r.code, 0) << r.err;
  // A shard cut short is refused whatever data.verify says.
  fs::resize_file(m.shards[2].path, 2000);
  r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=s", data_, " --data.verify=size"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("train-000002.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2000 bytes, but the manifest says"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("runs/s")));
}

TEST_F(Dataset, TheManifestsVocabularyMustFitTheModel) {
  std::string manifest = read_file(p("ds/train.json"));
  const size_t at = manifest.find("\"vocab_size\": 256");
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, 17, "\"vocab_size\": 300");
  write(p("ds/train.json"), manifest);
  const Result r = loom(cat("train ", p("nano.toml"), " --quiet", data_));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("train.json: vocab_size = 300 (its tokenizer's ids), but model.vocab_size = 256"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(p("runs/r")));
  // Prepare refuses a directory that already holds a dataset; nothing in it changes.
  const std::string before = read_file(p("ds/val.json"));
  const Result again = loom(cat("data prepare text:", p("text"), " --out ", p("ds")));
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("already holds a dataset"), std::string::npos) << again.err;
  EXPECT_EQ(read_file(p("ds/val.json")), before);
}

}  // namespace
}  // namespace loom
