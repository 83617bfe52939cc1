#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/data/data.h"
#include "loom/data/examples.h"
#include "loom/data/tokenizer.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom_testing.h"

namespace loom::data {
namespace {
namespace fs = std::filesystem;

using loom::testing::expect_input_error;

class DataTest : public loom::testing::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
};

TEST_F(DataTest, TokenFileRoundTripsAndMatchesLlmcLayout) {
  std::vector<uint16_t> toks = {1, 2, 65535, 0, 7};
  write_tokens(path("a.bin"), toks);
  EXPECT_EQ(read_tokens(path("a.bin")), toks);
  std::string raw = read_file(path("a.bin"));
  ASSERT_EQ(raw.size(), 1024u + 10u);
  int32_t h[3];
  std::memcpy(h, raw.data(), 12);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 5);
}

TEST_F(DataTest, BadTokenFilesNameFileAndExpectation) {
  write_tokens(path("ok.bin"), std::vector<uint16_t>(10, 3));
  std::string raw = read_file(path("ok.bin"));
  write("trunc.bin", raw.substr(0, raw.size() - 2));
  expect_input_error([&] { read_tokens(path("trunc.bin")); }, {"trunc.bin", "truncated", "10 tokens"});
  std::string bad = raw;
  bad[0] = 'X';
  write("magic.bin", bad);
  expect_input_error([&] { read_tokens(path("magic.bin")); }, {"magic.bin", "magic", "20240520"});
  write("short.bin", "abc");
  expect_input_error([&] { read_tokens(path("short.bin")); }, {"short.bin", "header"});
  expect_input_error([&] { read_tokens(path("missing.bin")); }, {"missing.bin", "cannot open"});
}

// A token file its header does not describe is refused before its tokens are read,
// however much memory the host has: 10 tokens in the header, 64 GiB (sparse) on disk.
TEST_F(DataTest, TokenHeaderIsCheckedBeforeTheTokensAreRead) {
  write_tokens(path("big.bin"), std::vector<uint16_t>(10, 3));
  fs::resize_file(path("big.bin"), uintmax_t{64} << 30);
  set_memory_budget(1e15);  // a host with room for it
  const int64_t before = loom::testing::peak_rss_bytes();
  expect_input_error([&] { read_tokens(path("big.bin")); }, {"big.bin", "oversized", "10 tokens"});
  set_memory_budget(0);
  EXPECT_LT(loom::testing::peak_rss_bytes() - before, int64_t{64} << 20);
}

// A budget given to the process (LOOM_HOST_MEMORY) stands in for the memory it measures:
// a whole-file read is refused past it, and allowed within it, on any machine.
TEST_F(DataTest, MemoryBudgetDecidesWholeFileReads) {
  write("k.bin", std::string(4096, 'x'));
  set_memory_budget(1000);
  EXPECT_EQ(available_memory_bytes(), 1000);
  expect_input_error([&] { read_file(path("k.bin")); }, {"k.bin", "4096 bytes, more than the 1000 bytes of memory"});
  set_memory_budget(1e6);
  EXPECT_EQ(read_file(path("k.bin")).size(), 4096u);
  set_memory_budget(0);
  EXPECT_GT(available_memory_bytes(), 0);
  EXPECT_GE(available_cores(), 1);
}

TEST_F(DataTest, PrepareSplitsEachFileAndSkipsBinaryAndLinks) {
  fs::create_directories(dir_ / "src");
  write("src/a", std::string(100, 'a'));
  write("src/b", std::string(50, 'b'));
  write("src/b.dat", std::string("\0\1\2", 3));
  fs::create_symlink(dir_ / "src/b", dir_ / "src/b.u8");
  auto r = prepare_text({.sources = {"text:" + path("src")}, .out = path("out/fortunes.bin"), .val_fraction = 0.1}, Tokenizer::bytes());
  EXPECT_EQ(r.files, 2);
  EXPECT_EQ(r.val_path, path("out/fortunes_val.bin"));
  auto train = read_tokens(r.train_path), val = read_tokens(r.val_path);
  EXPECT_EQ(train.size(), 90u + 45u);
  EXPECT_EQ(val.size(), 10u + 5u);
  EXPECT_EQ(train[0], 'a');
  EXPECT_EQ(val.back(), 'b');
  expect_input_error([&] { prepare_text({.sources = {"text:" + path("nope")}, .out = path("x.bin")}, Tokenizer::bytes()); }, {"nope", "no such"});
  expect_input_error([&] { prepare_text({.sources = {"csv:" + path("src")}, .out = path("x.bin")}, Tokenizer::bytes()); }, {"text:PATH"});
}

std::string idx(uint32_t magic, std::vector<uint32_t> dims, size_t data_bytes) {
  std::string s;
  auto be = [&](uint32_t v) {
    for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  be(magic);
  for (auto d : dims) be(d);
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

TEST_F(DataTest, IdxReadsAndRejectsCorruptFiles) {
  write("img", idx(0x803, {3, 2, 2}, 12));
  write("lab", idx(0x801, {3}, 3));
  ImageSet s = read_idx(path("img"), path("lab"));
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.labels, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FLOAT_EQ(s.pixels[5], 5.0f / 255.0f);
  write("img_trunc", idx(0x803, {3, 2, 2}, 11));
  expect_input_error([&] { read_idx(path("img_trunc"), path("lab")); }, {"img_trunc", "size mismatch"});
  write("img_magic", idx(0x802, {3, 2, 2}, 12));
  expect_input_error([&] { read_idx(path("img_magic"), path("lab")); }, {"img_magic", "magic"});
  write("lab4", idx(0x801, {4}, 4));
  expect_input_error([&] { read_idx(path("img"), path("lab4")); }, {"lab4", "4 labels for 3 images"});
  write("gz", std::string("\x1f\x8b\x08\x00garbage-that-is-not-deflate", 31));
  expect_input_error([&] { read_idx(path("gz"), path("lab")); }, {"gz"});
}

TEST(Sampler, EachEpochIsAPermutationAndDeterministic) {
  Sampler a(10, 42), b(10, 42);
  std::vector<int> count(10, 0);
  std::vector<int64_t> e0, e1;
  for (int64_t g = 0; g < 20; ++g) {
    int64_t i = a.item(g);
    EXPECT_EQ(i, b.item(g));
    (g < 10 ? e0 : e1).push_back(i);
    ++count[i];
  }
  for (int c : count) EXPECT_EQ(c, 2);
  EXPECT_NE(e0, e1);
  Sampler c(10, 42);
  EXPECT_EQ(c.item(13), e1[3]);  // random access, as a resumed run does
}

TEST(Examples, TokenWindowsAreLlmcsWindowsAndImagesKeepTheirLabels) {
  const TokenWindows w({10, 11, 12, 13, 14, 15, 16, 17}, 3);  // (8 - 1) / 3 = 2 full windows
  EXPECT_EQ(w.size(), 2);
  EXPECT_EQ(w.tokens_per_example(), 3);
  const std::vector<int64_t> which = {1, 0};
  const Batch b = w.batch(which);
  ASSERT_EQ(b.inputs.shape(), (Shape{2, 3}));
  const std::vector<int32_t> x(b.inputs.data<int32_t>(), b.inputs.data<int32_t>() + 6);
  const std::vector<int32_t> y(b.targets.data<int32_t>(), b.targets.data<int32_t>() + 6);
  EXPECT_EQ(x, (std::vector<int32_t>{13, 14, 15, 10, 11, 12}));
  EXPECT_EQ(y, (std::vector<int32_t>{14, 15, 16, 11, 12, 13}));

  ImageSet s{.n = 3, .rows = 1, .cols = 2, .pixels = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}, .labels = {7, 8, 9}};
  const ImageExamples images(std::move(s));
  EXPECT_EQ(images.size(), 3);
  const std::vector<int64_t> two = {2, 0};
  const Batch i = images.batch(two);
  ASSERT_EQ(i.inputs.shape(), (Shape{2, 2}));
  EXPECT_EQ(i.inputs.data<float>()[0], 4.f);
  EXPECT_EQ(i.inputs.data<float>()[3], 1.f);
  EXPECT_EQ(i.targets.data<int32_t>()[0], 9);
  EXPECT_EQ(i.targets.data<int32_t>()[1], 7);
}

TEST(FashionMnist, LoadsWhenInstalled) {
  if (!fs::exists(kFashionMnistDir)) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  ImageSet t = load_fashion_mnist(kFashionMnistDir, false);
  EXPECT_EQ(t.n, 10000);
  EXPECT_EQ(t.rows * t.cols, 784);
  for (int32_t l : t.labels) ASSERT_LT(l, 10);
}

}  // namespace
}  // namespace loom::data
