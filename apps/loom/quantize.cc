// `loom quantize` (docs/serving.md, "INT8 weights"): writes a checkpoint whose linear
// weights and tied embedding are int8 with an f32 scale per output channel;
// serve::load_gpt (loom/serve/gpt_loading.h) reads one back into a GPT that computes with them.
#include <cstdio>

#include "commands.h"
#include "infer.h"
#include "loom/serve/gpt_loading.h"
#include "kernels/int8_matmul.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/checkpoint/outputs.h"

namespace loom::app {
namespace {

namespace k = loom::kernels;

// The int8 weight in its logical layout and shape (the f32 tensor's).
Tensor logical(const std::string& name, const k::Int8Weight& w) {
  const bool rows = nn::Gpt::int8_by_rows(name);
  Tensor t = Tensor::zeros(rows ? Shape{w.m, w.k} : Shape{w.k, w.m}, DType::kI8);
  auto* out = t.data<int8_t>();
  for (int64_t j = 0; j < w.m; ++j)
    for (int64_t p = 0; p < w.k; ++p) out[rows ? j * w.k + p : p * w.m + j] = w.at(j, p);
  return t;
}

}  // namespace

int run_quantize(const QuantizeArgs& a) {
  checkpoint::check_output_root("--out", a.out, {a.checkpoint});
  Config c = inference_config(a.config, a.overrides);
  auto ck = checkpoint::Checkpoint::open(a.checkpoint);
  if (holds_int8(ck)) throw InputError(cat(a.checkpoint, ": already int8 (written by loom quantize)"));
  std::unique_ptr<nn::Gpt> gpt = serve::load_gpt(ck, c.i("model.n_head"));
  const int64_t f32_bytes = gpt->weight_bytes();
  const nn::Gpt::Int8Weights weights = gpt->quantize_int8();
  std::vector<checkpoint::Piece> pieces;
  auto whole = [](const std::string& name, Tensor t) {
    const Shape s = t.shape();
    return checkpoint::Piece{name, s, checkpoint::Box{.offsets = Shape(s.size(), 0), .extents = s}, std::move(t)};
  };
  for (int i = 0; i < static_cast<int>(gpt->params().infos().size()); ++i) {
    const ParamInfo& p = gpt->params().infos()[i];
    auto it = weights.find(p.name);
    if (it == weights.end()) {
      pieces.push_back(whole(p.name, gpt->params().value(i)));
      continue;
    }
    pieces.push_back(whole(p.name, logical(p.name, *it->second)));
    Tensor scales = Tensor::zeros({it->second->m}, DType::kF32);
    std::copy(it->second->scale.begin(), it->second->scale.end(), scales.data<float>());
    pieces.push_back(whole(p.name + serve::kInt8ScaleSuffix, std::move(scales)));
  }
  const nn::GptConfig& g = gpt->config();
  const nlohmann::json state = {
      {"model", {{"kind", "gpt"}, {"n_layer", g.n_layer}, {"n_head", g.n_head}, {"d_model", g.d_model},
                 {"seq_len", g.seq_len}, {"vocab_size", g.vocab_size}}},
      {"quantized", {{"from", ck.path()}, {"scheme", "int8, symmetric, per output channel"}}}};
  checkpoint::begin_save(a.out, 0);
  const std::string tmp = checkpoint::temp_dir(a.out, 0);
  const nlohmann::json record = checkpoint::write_shard(tmp, "model-00000.safetensors", pieces, checkpoint::Part::kModel, 0);
  const std::string dir =
      checkpoint::commit(a.out, 0, {record}, state, {{"world", 1}}, std::nullopt, {.files = ck.extra_files()});
  gpt->use_int8(weights);
  std::printf("quantized %zu weights to int8 (per output channel): weights %.2f MiB -> %.2f MiB (%.2fx smaller); wrote %s\n",
              weights.size(), static_cast<double>(f32_bytes) / (1 << 20), static_cast<double>(gpt->weight_bytes()) / (1 << 20),
              static_cast<double>(f32_bytes) / static_cast<double>(gpt->weight_bytes()), dir.c_str());
  return 0;
}

}  // namespace loom::app
