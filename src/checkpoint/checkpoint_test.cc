#include "loom/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>

#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/core/rng.h"
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

// A file its header does not describe is refused before its data is read, however much
// memory the host has: a valid header in front of 64 GiB (sparse), and a header length
// past the format's 16 MiB limit. Nothing of either is read: the peak RSS stays put.
TEST_F(CheckpointTest, SafetensorsHeaderIsCheckedBeforeTheDataIsRead) {
  write_safetensors(path("w.st"), {{"w", Tensor::zeros({4}, DType::kF32)}});
  fs::resize_file(path("w.st"), uintmax_t{64} << 30);
  std::string len(8, '\0');
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(len.data(), &n, 8);
  std::ofstream(path("len.st"), std::ios::binary) << len;
  fs::resize_file(path("len.st"), (uintmax_t{1} << 40) + 64);
  set_memory_budget(1e15);  // a host with room for both
  const int64_t before = loom::testing::peak_rss_bytes();
  expect_input_error([&] { SafetensorsFile::open(path("w.st")); }, {"w.st", "bytes after the last tensor"});
  expect_input_error([&] { SafetensorsFile::open(path("len.st")); }, {"len.st", "header length 1099511627776", "limit"});
  set_memory_budget(0);
  EXPECT_LT(loom::testing::peak_rss_bytes() - before, int64_t{64} << 20);
}

// A tiny GPT and its AdamW after one step: weights and moments all set.
struct OneStep {
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab_size = 5};
  nn::Gpt gpt{cfg};
  std::unique_ptr<optim::Optimizer> opt;
  OneStep() {
    gpt.init(1);
    opt = optim::make_optimizer({}, gpt.params());
    for (int64_t i = 0; i < gpt.params().numel(); ++i) gpt.params().grads().data<float>()[i] = 0.01f * (i % 7);
    opt->step(1e-3);
  }
};

TEST_F(CheckpointTest, SaveLoadRestoresWeightsAndOptimizer) {
  OneStep one;
  const nn::GptConfig& cfg = one.cfg;
  nn::Gpt& a = one.gpt;
  auto& opt = one.opt;
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
    std::fstream f(dir + "/model-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  // Found before any weight is copied, naming the file and the tensor whose bytes changed.
  nn::Gpt victim(cfg);
  victim.init(9);
  const std::vector<float> before(victim.params().values().data<float>(),
                                  victim.params().values().data<float>() + victim.params().numel());
  expect_input_error([&] { Checkpoint::open(dir).load_params(victim.params()); },
                     {"model-00000.safetensors", "SHA-256 mismatch", "in tensor transformer.ln_f.bias"});
  EXPECT_EQ(0, std::memcmp(before.data(), victim.params().values().raw(), victim.params().values().nbytes()));

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

TEST_F(CheckpointTest, ExtraFilesAreIndexedAndVerified) {
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .seq_len = 4, .vocab_size = 5};
  nn::Gpt a(cfg);
  const std::string dir = save(path("t"), 3, a.params(), nullptr, {},
                               {.files = {{"tokenizer/encoder.json", "{\"a\": 0}"}, {"tokenizer/vocab.bpe", "#version: 0.2\n"}}});
  Checkpoint c = Checkpoint::open(dir);
  EXPECT_EQ(c.extra_file("tokenizer/encoder.json"), "{\"a\": 0}");
  EXPECT_EQ(c.extra_file("tokenizer/vocab.bpe"), "#version: 0.2\n");
  EXPECT_EQ(c.extra_file("state.json"), std::nullopt) << "only kExtraFiles";
  EXPECT_EQ(Checkpoint::open(save(path("u"), 1, a.params(), nullptr, {})).extra_file("tokenizer/vocab.bpe"), std::nullopt);
  EXPECT_GT(c.verify_all(), 0);
  {
    std::fstream f(dir + "/tokenizer/vocab.bpe", std::ios::in | std::ios::out | std::ios::binary);
    f.put('!');
  }
  expect_input_error([&] { Checkpoint::open(dir).extra_file("tokenizer/vocab.bpe"); },
                     {"tokenizer/vocab.bpe", "SHA-256 mismatch with index.json"});
  expect_input_error([&] { Checkpoint::open(dir).verify_all(); }, {"tokenizer/vocab.bpe", "SHA-256 mismatch"});
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

// The boxes of a flat range hold exactly its elements, in order.
TEST_F(CheckpointTest, RangeBoxesCoverExactlyTheRange) {
  Rng rng(5, 0);
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{3, 1, 2, 5}, Shape{4, 0}}) {
    const int64_t n = shape_numel(shape);
    for (int trial = 0; trial < 40; ++trial) {
      int64_t a = n == 0 ? 0 : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n + 1));
      int64_t b = n == 0 ? 0 : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n + 1));
      if (a > b) std::swap(a, b);
      std::vector<int64_t> got;
      const std::vector<Box> boxes = range_boxes(shape, a, b);
      EXPECT_LE(boxes.size(), std::max<size_t>(1, 2 * shape.size() - 1));
      for (const Box& box : boxes) {
        // Every element of the box, row-major.
        Shape at(shape.size(), 0);
        for (int64_t k = 0; k < box.numel(); ++k) {
          int64_t flat = 0, rest = k;
          for (size_t d = shape.size(); d-- > 0;) {
            at[d] = rest % box.extents[d];
            rest /= box.extents[d];
          }
          for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + box.offsets[d] + at[d];
          got.push_back(flat);
        }
      }
      std::vector<int64_t> want(static_cast<size_t>(b - a));
      std::iota(want.begin(), want.end(), a);
      EXPECT_EQ(got, want) << shape_str(shape) << " [" << a << ", " << b << ")";
    }
  }
}

// Layouts made by hand: `parts` tensor-parallel pieces of three parameters (a fused
// three-group weight split by columns, a replicated bias, an embedding split by rows), each
// piece's flat buffer cut among `writers` ranks. A checkpoint written by one layout loads
// into every other, bit for bit.
struct HandLayout {
  int parts, writers;
};

std::vector<std::unique_ptr<ParamSet>> pieces_of(const HandLayout& l) {
  std::vector<std::unique_ptr<ParamSet>> out;
  for (int i = 0; i < l.parts; ++i) {
    auto p = std::make_unique<ParamSet>();
    p->add("w", {4, 3 * (6 / l.parts)}, ParamKind::kWeight, {.dim = 1, .groups = 3, .index = i, .parts = l.parts});
    p->add("b", {5}, ParamKind::kBias);
    p->add("e", {12 / l.parts, 3}, ParamKind::kEmbedding, {.dim = 0, .groups = 1, .index = i, .parts = l.parts});
    p->allocate();
    out.push_back(std::move(p));
  }
  return out;
}

TEST_F(CheckpointTest, AnyLayoutLoadsIntoAnyOther) {
  // The logical tensors: w (4, 18), b (5), e (12, 3), every element distinct.
  std::map<std::string, std::vector<float>> logical;
  float next = 1;
  for (auto [name, n] : {std::pair{"w", 72}, std::pair{"b", 5}, std::pair{"e", 36}})
    for (int k = 0; k < n; ++k) logical[name].push_back(next++);
  auto fill = [&](ParamSet& ps) {
    for (size_t i = 0; i < ps.infos().size(); ++i)
      take_piece(ps.infos()[i], logical[ps.infos()[i].name].data(), ps.value(static_cast<int>(i)).data<float>());
  };
  const std::vector<HandLayout> layouts = {{1, 1}, {1, 3}, {2, 1}, {2, 2}, {3, 2}, {6, 1}};
  for (const HandLayout& from : layouts) {
    const std::string root = path(cat("from_", from.parts, "x", from.writers));
    begin_save(root, 1);
    std::vector<nlohmann::json> records;
    auto sets = pieces_of(from);
    for (int i = 0; i < from.parts; ++i) {
      ParamSet& ps = *sets[i];
      fill(ps);
      for (int w = 0; w < from.writers; ++w) {
        // Writer w's share of the flat buffer; piece 0 alone writes the replicated bias.
        const int64_t lo = ps.numel() * w / from.writers, hi = ps.numel() * (w + 1) / from.writers;
        std::vector<FlatRun> runs;
        const ParamInfo& b = ps.infos()[1];
        for (auto [rlo, rhi] : {std::pair{lo, std::min(hi, b.offset)}, std::pair{std::max(lo, b.offset + b.numel), hi}})
          if (rhi > rlo) runs.push_back({rlo, rhi, ps.values().data<float>() + rlo});
        if (i == 0 && std::max(lo, b.offset) < std::min(hi, b.offset + b.numel))
          runs.push_back({std::max(lo, b.offset), std::min(hi, b.offset + b.numel),
                          ps.values().data<float>() + std::max(lo, b.offset)});
        std::sort(runs.begin(), runs.end(), [](const FlatRun& x, const FlatRun& y) { return x.begin < y.begin; });
        records.push_back(write_shard(temp_dir(root, 1), cat("model-", i * from.writers + w, ".safetensors"),
                                      pieces(ps, runs), Part::kModel, 1));
      }
    }
    commit(root, 1, records, {}, {{"tp", from.parts}}, std::nullopt);
    const Checkpoint c = Checkpoint::open(root);
    for (const HandLayout& to : layouts) {
      for (auto& ps : pieces_of(to)) {
        c.load_params(*ps);
        auto want = std::make_unique<ParamSet>();
        for (const ParamInfo& p : ps->infos()) want->add(p.name, p.shape, p.kind, p.split);
        want->allocate();
        fill(*want);
        EXPECT_EQ(0, std::memcmp(want->values().raw(), ps->values().raw(), ps->values().nbytes()))
            << "from tp " << from.parts << " x " << from.writers << " to tp " << to.parts;
      }
    }
    EXPECT_EQ(c.read("w", DType::kF32).data<float>()[19], logical["w"][19]);
  }
}

// An index whose shards overlap, leave a hole, or point past the tensor is refused by name.
TEST_F(CheckpointTest, ShardsThatDoNotTileTheTensorAreRefused) {
  ParamSet ps;
  ps.add("w", {4, 6}, ParamKind::kWeight);
  ps.allocate();
  const std::string root = path("tile");
  begin_save(root, 1);
  const std::string tmp = temp_dir(root, 1);
  const nlohmann::json rec = write_shard(tmp, "model-0.safetensors", pieces(ps, {{0, 24, ps.values().raw()}}), Part::kModel, 1);
  const std::string dir = commit(root, 1, {rec}, {}, {}, std::nullopt);
  const std::string index_path = dir + "/index.json";
  const nlohmann::json good = nlohmann::json::parse(read_file(index_path));
  auto with_shards = [&](const nlohmann::json& shards) {
    nlohmann::json j = good;
    j["tensors"][0]["shards"] = shards;
    write_file_atomic(index_path, j.dump());
    write_file_atomic(dir + "/index.sha256", sha256_hex(j.dump()));  // the index's own hash agrees
  };
  nlohmann::json s = good["tensors"][0]["shards"][0];
  nlohmann::json half = s, other = s;
  half["extents"] = {2, 6};
  other["key"] = "w2";
  other["extents"] = {3, 6};
  other["offsets"] = {1, 0};
  with_shards({half, other});
  expect_input_error([&] { Checkpoint::open(dir); }, {"index.json", "tensors[0].shards", "hold 30 elements of a tensor of 24"});
  other["extents"] = {2, 6};
  with_shards({half, other});
  expect_input_error([&] { Checkpoint::open(dir); }, {"index.json", "tensor w", "shards 0 and 1 overlap"});
  other["offsets"] = {3, 0};
  with_shards({half, other});
  expect_input_error([&] { Checkpoint::open(dir); }, {"index.json", "extents", "not a non-empty block of the shape [4, 6]"});
}

// 1000 random truncations and bit flips of a checkpoint's files (both shards, the index, its
// hash, the state): each is refused before any weight or moment is copied, by a line naming
// the file, and the tensor when a flip lands in one's bytes.
TEST_F(CheckpointTest, EveryTruncationAndBitFlipIsFoundBeforeUse) {
  OneStep one;
  const nn::GptConfig& cfg = one.cfg;
  const std::string good = save(path("good"), 1, one.gpt.params(), one.opt.get(), {{"data_cursor", 4}});
  const std::vector<std::string> files = {"model-00000.safetensors", "optimizer-00000.safetensors", "index.json",
                                          "index.sha256", "state.json"};
  Rng rng(17, 0);
  nn::Gpt b(cfg);
  auto opt_b = optim::make_optimizer({}, b.params());
  int refused = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const std::string dir = path(cat("t", trial));
    fs::copy(good, dir);
    const std::string& file = files[rng.below(files.size())];
    std::string bytes = read_file(dir + "/" + file);
    const bool flip = rng.below(2) == 0;
    size_t at = rng.below(bytes.size());
    if (flip) bytes[at] = static_cast<char>(bytes[at] ^ (1 << rng.below(8)));
    else bytes.resize(at);
    { std::ofstream(dir + "/" + file, std::ios::binary | std::ios::trunc) << bytes; }
    b.params().values().zero();
    for (auto& [name, t] : opt_b->state()) t.zero();
    const std::string what = cat(file, flip ? " bit flipped at " : " truncated to ", at);
    try {
      const Checkpoint c = Checkpoint::open(dir);
      c.load_params(b.params());
      c.load_optimizer(b.params(), *opt_b);
      ADD_FAILURE() << what << ": accepted";
    } catch (const InputError& e) {
      ++refused;
      const std::string m = e.what();
      EXPECT_NE(m.find(file == "index.sha256" ? "index" : file), std::string::npos) << what << ": " << m;
      // A flip in a tensor's bytes names the tensor.
      uint64_t header = 0;
      std::memcpy(&header, read_file(good + "/" + file).data(), 8);
      if (flip && file.ends_with(".safetensors") && at >= 8 + header) {
        EXPECT_NE(m.find("in tensor "), std::string::npos) << what << ": " << m;
      }
    }
    // Nothing of a refused checkpoint was copied: a corrupt optimizer file is found after
    // the (verified) weights are in, never after a moment is.
    for (auto& [name, t] : opt_b->state()) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        ASSERT_EQ(t.data<float>()[i], 0.0f) << what;
      }
    }
    if (file != "optimizer-00000.safetensors") {
      for (int64_t i = 0; i < b.params().numel(); ++i) {
        ASSERT_EQ(b.params().values().data<float>()[i], 0.0f) << what;
      }
    }
    fs::remove_all(dir);
  }
  EXPECT_EQ(refused, 1000);
}

}  // namespace
}  // namespace loom::checkpoint
