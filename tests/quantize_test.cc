// INT8 weights (docs/serving.md, "INT8 weights"): `loom quantize` writes int8 weights with
// their scales, `eval` and `sample` compute with them (the same bits as quantizing at load
// with --quantize int8), the loss stays within 1% of f32, and bad input is a one-line error.
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "loom/checkpoint/safetensors.h"

namespace loom {
namespace {

double loss_of(const Result& r) { return nlohmann::json::parse(r.out)["loss"].get<double>(); }

int64_t model_bytes(const std::string& path) {
  int64_t bytes = 0;
  for (const auto& [file, n] : checkpoint::Checkpoint::open(path).files())
    if (file.starts_with("model-")) bytes += n;
  return bytes;
}

TEST_F(Cli, QuantizedWeightsEvaluateAndSampleAsQuantizingAtLoadDoes) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=20 --job.name=base")).code, 0);
  Result q = loom(cat("quantize --checkpoint ", p("runs/base"), " --out ", p("q8")));
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_NE(q.out.find("x smaller"), std::string::npos) << q.out;

  const auto ck = checkpoint::Checkpoint::open(p("q8"));
  int int8 = 0;
  for (const checkpoint::TensorInfo& t : ck.tensors()) {
    if (t.dtype != DType::kI8) continue;
    ++int8;
    const auto scale = ck.find(t.name + "_scale");
    ASSERT_TRUE(scale.has_value()) << t.name;
    EXPECT_EQ(scale->dtype, DType::kF32);
    const bool table = t.name.find(".wte.") != std::string::npos || t.name.find(".wpe.") != std::string::npos;
    EXPECT_EQ(scale->shape[0], table ? t.shape[0] : t.shape[1]) << t.name;
  }
  EXPECT_EQ(int8, 2 * 4 + 2);  // every block's four linear weights, wte and wpe
  EXPECT_EQ(ck.find("transformer.h.0.attn.c_attn.bias")->dtype, DType::kF32);
  EXPECT_LT(model_bytes(p("q8")) * 3, model_bytes(p("runs/base")));

  const std::string data = cat(" --data ", p("val.bin"));
  const Result f32 = loom(cat("eval --checkpoint ", p("runs/base"), data));
  const Result at_load = loom(cat("eval --checkpoint ", p("runs/base"), data, " --quantize int8"));
  const Result file = loom(cat("eval --checkpoint ", p("q8"), data));
  ASSERT_EQ(f32.code + at_load.code + file.code, 0) << f32.err << at_load.err << file.err;
  EXPECT_EQ(file.out, at_load.out);
  EXPECT_NE(file.out, f32.out);
  EXPECT_LT(std::fabs(loss_of(file) - loss_of(f32)) / loss_of(f32), 0.01);

  const std::string sample = " --tokens 40 --seed 3 --prompt Q";
  const Result s1 = loom(cat("sample --checkpoint ", p("q8"), sample));
  const Result s2 = loom(cat("sample --checkpoint ", p("runs/base"), sample, " --quantize int8"));
  ASSERT_EQ(s1.code + s2.code, 0) << s1.err << s2.err;
  EXPECT_EQ(s1.out, s2.out);
}

TEST_F(Cli, QuantizeRefusesWhatCannotWork) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=1 --job.name=base")).code, 0);
  ASSERT_EQ(loom(cat("quantize --checkpoint ", p("runs/base"), " --out ", p("q8"))).code, 0);
  expect_bad_input(cat("quantize --checkpoint ", p("q8"), " --out ", p("x")), {p("q8"), "already int8"});
  expect_bad_input(cat("eval --checkpoint ", p("runs/base"), " --data ", p("val.bin"), " --quantize int4"),
                   {"--quantize int4", "none or int8"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=t --init-from ", p("q8")), {"I8"});
  EXPECT_FALSE(std::filesystem::exists(p("x")));

  // A bare file with a scale missing, then with a negative one: the error names the tensor.
  const auto ck = checkpoint::Checkpoint::open(p("q8"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const checkpoint::TensorInfo& t : ck.tensors())
    if (t.name != "transformer.h.1.mlp.c_fc.weight_scale") tensors.emplace_back(t.name, ck.read(t.name, t.dtype));
  write_safetensors(p("missing.safetensors"), tensors, {});
  const std::string n_head = " --model.n_head=2 --data " + p("val.bin");
  expect_bad_input(cat("eval --checkpoint ", p("missing.safetensors"), n_head),
                   {"missing.safetensors", "transformer.h.1.mlp.c_fc.weight_scale", "found none"});
  Tensor scale = ck.read("transformer.h.1.mlp.c_fc.weight_scale", DType::kF32);
  scale.data<float>()[5] = -1.0f;
  tensors.emplace_back("transformer.h.1.mlp.c_fc.weight_scale", scale);
  write_safetensors(p("negative.safetensors"), tensors, {});
  expect_bad_input(cat("eval --checkpoint ", p("negative.safetensors"), n_head),
                   {"transformer.h.1.mlp.c_fc.weight_scale[5] = -1", "finite scale >= 0"});
}

}  // namespace
}  // namespace loom
