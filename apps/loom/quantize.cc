// INT8 weights (docs/serving.md, "INT8 weights"): `loom quantize` writes a checkpoint whose
// linear weights and tied embedding are int8 with an f32 scale per output channel, and
// load_gpt reads one back into a GPT that computes with them.
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <set>

#include "commands.h"
#include "infer.h"
#include "kernels/int8_matmul.h"
#include "loom/checkpoint.h"
#include "loom/error.h"
#include "outputs.h"

namespace loom::app {
namespace {

namespace k = loom::kernels;
constexpr const char* kWte = "transformer.wte.weight";
constexpr const char* kScale = "_scale";  // "<weight name>_scale": its channels' scales (F32)

// The int8 weight in its logical layout and shape (the f32 tensor's).
Tensor logical(const std::string& name, const k::Int8Weight& w) {
  const bool rows = nn::Gpt::int8_by_rows(name);
  Tensor t = Tensor::zeros(rows ? Shape{w.m, w.k} : Shape{w.k, w.m}, DType::kI8);
  auto* out = t.data<int8_t>();
  for (int64_t j = 0; j < w.m; ++j)
    for (int64_t p = 0; p < w.k; ++p) out[rows ? j * w.k + p : p * w.m + j] = w.at(j, p);
  return t;
}

std::string index_of(const checkpoint::Checkpoint& ck) {
  return ck.format_version() == 0 ? ck.path() : (std::filesystem::path(ck.path()) / "index.json").string();
}

}  // namespace

bool holds_int8(const checkpoint::Checkpoint& ck) {
  std::optional<checkpoint::TensorInfo> wte = ck.find(kWte);
  return wte && wte->dtype == DType::kI8;
}

void load_int8(const checkpoint::Checkpoint& ck, nn::Gpt& gpt) {
  const std::vector<std::string> names = gpt.int8_weight_names();
  const std::set<std::string> int8(names.begin(), names.end());
  const std::string file = index_of(ck);
  // The f32 rest, tensor by tensor (ck reads and verifies each file before its first use).
  for (int i = 0; i < static_cast<int>(gpt.params().infos().size()); ++i) {
    const ParamInfo& p = gpt.params().infos()[i];
    if (int8.contains(p.name)) continue;
    std::optional<checkpoint::TensorInfo> e = ck.find(p.name);
    if (!e) throw InputError(cat(file, ": no tensor ", p.name));
    if (e->shape != p.shape)
      throw InputError(cat(file, ": tensor ", p.name, " has shape ", shape_str(e->shape), "; expected ", shape_str(p.shape)));
    gpt.params().value(i).copy_from(ck.read(p.name, DType::kF32));
  }
  nn::Gpt::Int8Weights weights;
  for (const std::string& name : names) {
    const ParamInfo& p = gpt.params().infos()[gpt.params().find(name)];
    std::optional<checkpoint::TensorInfo> q = ck.find(name), s = ck.find(name + kScale);
    const bool rows = nn::Gpt::int8_by_rows(name);
    const int64_t channels = rows ? p.shape[0] : p.shape[1], depth = rows ? p.shape[1] : p.shape[0];
    if (!q || q->dtype != DType::kI8 || q->shape != p.shape)
      throw InputError(cat(file, ": tensor ", name, ": expected I8 of shape ", shape_str(p.shape), " (an int8 checkpoint)",
                           q ? cat(", found ", safetensors_dtype_name(q->dtype), " ", shape_str(q->shape)) : ""));
    if (!s || s->shape != Shape{channels})
      throw InputError(cat(file, ": tensor ", name, kScale, ": expected ", channels, " scales (F32)",
                           s ? cat(", found shape ", shape_str(s->shape)) : ", found none"));
    const Tensor values = ck.read(name, DType::kI8), scales = ck.read(name + kScale, DType::kF32);
    k::Int8Weight w = k::make_int8_weight(depth, channels);
    for (int64_t j = 0; j < channels; ++j) {
      const float scale = scales.data<float>()[j];
      if (!(scale >= 0) || !std::isfinite(scale))
        throw InputError(cat(file, ": tensor ", name, kScale, "[", j, "] = ", scale, ": expected a finite scale >= 0"));
      w.scale[j] = scale;
      for (int64_t i = 0; i < depth; ++i)
        w.at(j, i) = values.data<int8_t>()[rows ? j * depth + i : i * channels + j];
    }
    k::finish_int8_weight(w);
    weights[name] = std::make_shared<const k::Int8Weight>(std::move(w));
  }
  gpt.use_int8(std::move(weights));
}

int64_t gpt_weight_bytes(const nn::GptConfig& g, bool int8) {
  const int64_t f32 = static_cast<int64_t>(nn::gpt_counts(g).total()) * 4;
  if (!int8) {  // panels: each linear weight's columns rounded up to 32, and the head's in place of wte
    const auto cols = [](int64_t n) { return (n + 31) / 32 * 32; };
    const int64_t c = g.d_model;
    const int64_t pad = c * (cols(3 * c) - 3 * c) + c * (cols(c) - c) + c * (cols(4 * c) - 4 * c) + 4 * c * (cols(c) - c);
    return f32 + 4 * (g.n_layer * pad + c * (cols(g.vocab_size) - g.vocab_size));
  }
  // Each int8 weight: 1 byte a value in place of 4, and a 4-byte scale per output channel.
  const int64_t c = g.d_model, linear = 12 * c * c, channels = 9 * c;  // per block: 3C + C + 4C + C outputs
  return f32 - 3 * (g.n_layer * linear + (g.vocab_size + g.seq_len) * c) +
         4 * (g.n_layer * channels + g.vocab_size + g.seq_len);
}

bool quantize_named(const std::string& value) {
  if (value == "int8") return true;
  if (value == "none" || value.empty()) return false;
  throw InputError(cat("--quantize ", printable(value), ": expected none or int8"));
}

DType kv_cache_dtype_named(const std::string& value) {
  if (value == "f32") return DType::kF32;
  if (value == "bf16") return DType::kBF16;
  throw InputError(cat("--kv-cache-dtype ", printable(value), ": expected f32 or bf16"));
}

int run_quantize(const QuantizeArgs& a) {
  check_output_root("--out", a.out, {a.checkpoint});
  Config c = inference_config(a.config, a.overrides);
  auto ck = checkpoint::Checkpoint::open(a.checkpoint);
  if (holds_int8(ck)) throw InputError(cat(a.checkpoint, ": already int8 (written by loom quantize)"));
  std::unique_ptr<nn::Gpt> gpt = load_gpt(ck, c);
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
    pieces.push_back(whole(p.name + kScale, std::move(scales)));
  }
  const nn::GptConfig& g = gpt->config();
  const nlohmann::json state = {
      {"model", {{"kind", "gpt"}, {"n_layer", g.n_layer}, {"n_head", g.n_head}, {"d_model", g.d_model},
                 {"seq_len", g.seq_len}, {"vocab_size", g.vocab_size}}},
      {"quantized", {{"from", ck.path()}, {"scheme", "int8, symmetric, per output channel"}}}};
  checkpoint::begin_save(a.out, 0);
  const std::string tmp = checkpoint::temp_dir(a.out, 0);
  const nlohmann::json record = checkpoint::write_shard(tmp, "model-00000.safetensors", pieces, checkpoint::Part::kModel, 0);
  const std::string dir = checkpoint::commit(a.out, 0, {record}, state, {{"world", 1}}, std::nullopt);
  gpt->use_int8(weights);
  std::printf("quantized %zu weights to int8 (per output channel): weights %.2f MiB -> %.2f MiB (%.2fx smaller); wrote %s\n",
              weights.size(), static_cast<double>(f32_bytes) / (1 << 20), static_cast<double>(gpt->weight_bytes()) / (1 << 20),
              static_cast<double>(f32_bytes) / static_cast<double>(gpt->weight_bytes()), dir.c_str());
  return 0;
}

}  // namespace loom::app
