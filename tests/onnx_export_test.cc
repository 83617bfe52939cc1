// `loom ckpt export --format onnx`: the file passes onnx's checker (full, strict shape
// inference), and the logits its graph computes for fixed tokens (onnx's reference
// evaluator, or the graph evaluated op by op in numpy where the installed onnx has none:
// tools/onnx_eval.py) match Loom's. Skipped, with the reason, without python3-onnx.
#include <cstdlib>
#include <fstream>

#include "cli_fixture.h"
#include "loom/nn/gpt.h"

namespace loom {
namespace {

const nn::GptConfig kNano{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256};

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(Cli, OnnxExportComputesLoomsLogits) {
  if (run("/usr/bin/python3 -c 'import onnx, numpy' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-onnx (or numpy) is not installed: scripts/setup.sh installs it";
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=n")).code, 0);
  const Result r = loom(cat("ckpt export ", p("runs/n"), " --format onnx --out ", p("n.onnx")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("opset 17"), std::string::npos) << r.out;

  // Two sequences of 17 tokens (less than the window: the graph cuts its mask and positions).
  const int64_t b = 2, t = 17;
  Tensor tokens = Tensor::zeros({b, t}, DType::kI32);
  std::ofstream ids(p("tokens.txt"));
  ids << b << " " << t;
  for (int64_t i = 0; i < b * t; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11) % 256);
    ids << " " << tokens.data<int32_t>()[i];
  }
  ids.close();
  nn::Gpt gpt(kNano);
  checkpoint::Checkpoint::open(p("runs/n")).load_params(gpt.params());
  nn::GptCtx ctx;
  const Tensor logits = gpt.forward_logits(tokens, ctx, /*last_only=*/false);
  write(p("expected.f32"), std::string(static_cast<const char*>(logits.raw()), logits.nbytes()));
  const std::string eval = cat("/usr/bin/python3 ", LOOM_SOURCE_DIR, "/tools/onnx_eval.py ", p("n.onnx"), " ",
                               p("tokens.txt"), " ");
  EXPECT_EQ(run(cat(eval, p("expected.f32"), " 1e-4 > ", p("eval.out"), " 2>&1")), 0) << read_file(p("eval.out"));
  // The comparison can fail: one logit off by 1e-3 is caught.
  Tensor off = logits;
  off.data<float>()[b * t * 256 - 5] += 1e-3f;
  write(p("off.f32"), std::string(static_cast<const char*>(off.raw()), off.nbytes()));
  EXPECT_EQ(run(cat(eval, p("off.f32"), " 1e-4 > /dev/null 2>&1")), 1);
}

TEST_F(Cli, OnnxExportRefusesWhatItCannotWrite) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=n --training.steps=1")).code, 0);
  expect_bad_input(cat("ckpt export ", p("runs/n"), " --format tflite --out ", p("x")), {"--format tflite", "safetensors or onnx"});
  ASSERT_EQ(loom(cat("quantize --checkpoint ", p("runs/n"), " --out ", p("q8"))).code, 0);
  expect_bad_input(cat("ckpt export ", p("q8"), " --format onnx --out ", p("x")), {"int8", "export the f32 checkpoint"});
  EXPECT_FALSE(std::filesystem::exists(p("x")));
}

}  // namespace
}  // namespace loom
