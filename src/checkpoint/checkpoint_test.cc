#include "loom/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/fileio.h"
#include "loom/nn/gpt.h"
#include "loom_testing.h"

namespace loom::checkpoint {
namespace {
namespace fs = std::filesystem;

using loom::testing::expect_input_error;
using CheckpointTest = loom::testing::TempDirTest;

// A safetensors file from a raw header string and data bytes.
void write_raw(const std::string& p, const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  s += header + std::string(data_bytes, '\0');
  std::ofstream(p, std::ios::binary) << s;
}

TEST_F(CheckpointTest, SafetensorsRoundTripWithConversion) {
  Tensor a = Tensor::zeros({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = 0.5f * i;
  Tensor b = Tensor::zeros({4}, DType::kBF16);
  b.data<uint16_t>()[1] = f32_to_bf16(-3.0f);
  write_safetensors(path("x.safetensors"), {{"a", a}, {"b", b}}, {{"format", "pt"}});
  auto f = SafetensorsFile::open(path("x.safetensors"));
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor a2 = Tensor::zeros({2, 3}, DType::kF32);
  f.read_into(*f.find("a"), a2);
  EXPECT_EQ(a2.data<float>()[5], 2.5f);
  Tensor b2 = Tensor::zeros({4}, DType::kF64);
  f.read_into(*f.find("b"), b2);
  EXPECT_EQ(b2.data<double>()[1], -3.0);
  // Header length is a multiple of 8 (data aligned), as the reference writer does.
  std::string raw = read_file(path("x.safetensors"));
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(CheckpointTest, CorruptSafetensorsAreNamedErrors) {
  write_raw(path("notjson.st"), "{not json", 0);
  expect_input_error([&] { SafetensorsFile::open(path("notjson.st")); }, {"notjson.st", "not JSON"});
  write_raw(path("past.st"), R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_input_error([&] { SafetensorsFile::open(path("past.st")); }, {"past.st", "tensor w", "past the end"});
  write_raw(path("shape.st"), R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  expect_input_error([&] { SafetensorsFile::open(path("shape.st")); }, {"shape.st", "needs 12 bytes"});
  write_raw(path("overlap.st"),
            R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6);
  expect_input_error([&] { SafetensorsFile::open(path("overlap.st")); }, {"overlap"});
  std::string huge(8, '\xff');
  std::ofstream(path("len.st"), std::ios::binary) << huge;
  expect_input_error([&] { SafetensorsFile::open(path("len.st")); }, {"len.st", "header length"});
  write_raw(path("dtype.st"), R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1);
  expect_input_error([&] { SafetensorsFile::open(path("dtype.st")); }, {"unsupported dtype Q4"});
}

TEST_F(CheckpointTest, SaveLoadRestoresWeightsAndOptimizer) {
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab_size = 5};
  nn::Gpt a(cfg);
  a.init(1);
  auto opt = optim::make_optimizer({}, a.params());
  for (int64_t i = 0; i < a.params().numel(); ++i) a.params().grads().data<float>()[i] = 0.01f * (i % 7);
  opt->step(1e-3);
  std::string root = path("ckpts");
  std::string dir = save(root, 7, a.params(), opt.get(), {{"data_cursor", 42}}, {.keep = 2});
  save(root, 8, a.params(), opt.get(), {}, {.keep = 2});
  save(root, 9, a.params(), opt.get(), {}, {.keep = 2});
  EXPECT_FALSE(fs::exists(dir));  // pruned: keep 2
  EXPECT_EQ(latest_step_dir(root), (fs::path(root) / "step_9").string());

  nn::Gpt b(cfg);
  auto opt_b = optim::make_optimizer({}, b.params());
  Checkpoint c = Checkpoint::open(root);
  EXPECT_EQ(c.state().step, 9);
  c.load_params(b.params());
  c.load_optimizer(b.params(), *opt_b);
  EXPECT_EQ(opt_b->steps(), 1);
  EXPECT_EQ(0, std::memcmp(a.params().values().raw(), b.params().values().raw(), a.params().values().nbytes()));
  for (size_t r = 0; r < 2; ++r)
    EXPECT_EQ(0, std::memcmp(opt->state()[r].second.raw(), opt_b->state()[r].second.raw(),
                             opt->state()[r].second.nbytes()));
  // No temporary directory is left behind.
  for (const auto& e : fs::directory_iterator(root)) EXPECT_FALSE(e.path().filename().string().starts_with("."));
}

TEST_F(CheckpointTest, CorruptionAndShapeMismatchAreNamed) {
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab_size = 5};
  nn::Gpt a(cfg);
  std::string dir = save(path("c"), 1, a.params(), nullptr, {});
  {
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  expect_input_error([&] { Checkpoint::open(dir); }, {"model.safetensors", "SHA-256 mismatch"});

  std::string dir2 = save(path("d"), 1, a.params(), nullptr, {});
  nn::GptConfig other = cfg;
  other.d_model = 16;
  nn::Gpt b(other);
  Checkpoint c = Checkpoint::open(dir2);
  expect_input_error([&] { c.load_params(b.params()); }, {"transformer.wte.weight", "[5, 8]", "[5, 16]"});
  nn::GptConfig deeper = cfg;
  deeper.n_layer = 2;
  nn::Gpt d(deeper);
  expect_input_error([&] { c.load_params(d.params()); }, {"no tensor transformer.h.1"});
  expect_input_error([&] { Checkpoint::open(path("nowhere")); }, {"nowhere", "no such checkpoint"});
}

TEST_F(CheckpointTest, BareHuggingFaceFileWithoutPrefixLoads) {
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab_size = 5};
  nn::Gpt a(cfg);
  a.init(3);
  std::vector<std::pair<std::string, Tensor>> ts;
  for (size_t i = 0; i < a.params().infos().size(); ++i) {
    std::string n = a.params().infos()[i].name.substr(std::string("transformer.").size());
    Tensor v = a.params().value(static_cast<int>(i));
    Tensor half = Tensor::zeros(v.shape(), DType::kF16);  // HF files are often f16
    for (int64_t j = 0; j < v.numel(); ++j) half.data<uint16_t>()[j] = f32_to_f16(v.data<float>()[j]);
    ts.emplace_back(n, half);
  }
  write_safetensors(path("hf.safetensors"), ts);
  nn::Gpt b(cfg);
  Checkpoint::open(path("hf.safetensors")).load_params(b.params());
  float want = a.params().values().data<float>()[10];
  EXPECT_EQ(b.params().values().data<float>()[10], f16_to_f32(f32_to_f16(want)));
}

}  // namespace
}  // namespace loom::checkpoint
