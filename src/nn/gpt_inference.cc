// A GPT's inference-only weights (loom/nn/gpt.h; docs/serving.md): INT8 (Gpt::use_int8)
// and f32 panels (Gpt::use_panels).
#include "kernels/gemm/gemm.h"
#include "kernels/int8_matmul.h"
#include "loom/core/error.h"
#include "loom/nn/gpt.h"

namespace loom::nn {
namespace k = loom::kernels;

std::vector<std::string> Gpt::int8_weight_names() const {
  std::vector<std::string> names;
  for (int64_t l = 0; l < config_.n_layer; ++l)
    for (const char* layer : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
      names.push_back(cat("transformer.h.", l, ".", layer, ".weight"));
  names.emplace_back("transformer.wte.weight");
  names.emplace_back("transformer.wpe.weight");
  return names;
}

Gpt::Int8Weights Gpt::quantize_int8() const {
  Int8Weights out;
  for (const std::string& name : int8_weight_names()) {
    const int i = params_.find(name);
    LOOM_CHECK(i >= 0 && params_.dtype() == DType::kF32);
    const ParamInfo& p = params_.infos()[i];
    const Tensor w = params_.value(i);
    // A linear weight is (in, out); an embedding table (rows, C) is quantized by rows (for
    // wte, the tied head's output channels).
    const bool table = int8_by_rows(name);
    out[name] = std::make_shared<const k::Int8Weight>(
        table ? k::quantize_int8(w.data<float>(), p.shape[1], p.shape[0], k::WeightLayout::kMK)
              : k::quantize_int8(w.data<float>(), p.shape[0], p.shape[1], k::WeightLayout::kKM));
  }
  return out;
}

void Gpt::use_int8(Int8Weights weights) {
  LOOM_CHECK(part_.all_blocks && part_.embeddings && part_.head && !tp_.split() && params_.dtype() == DType::kF32);
  auto take = [&](const std::string& name, int64_t in, int64_t out) {
    auto it = weights.find(name);
    LOOM_CHECK(it != weights.end() && it->second->k == in && it->second->m == out);
    const Tensor w = params_.value(params_.find(name));
    discard_pages(w.raw(), w.nbytes());  // forward reads the int8 copy
    return it->second.get();
  };
  const int64_t c = config_.d_model;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    Block& b = blocks_[l];
    const std::string prefix = cat("transformer.h.", l, ".");
    b.attn.c_attn.int8 = take(prefix + "attn.c_attn.weight", c, 3 * c);
    b.attn.c_proj.int8 = take(prefix + "attn.c_proj.weight", c, c);
    b.mlp.c_fc.int8 = take(prefix + "mlp.c_fc.weight", c, 4 * c);
    b.mlp.c_proj.int8 = take(prefix + "mlp.c_proj.weight", 4 * c, c);
  }
  wte_.int8 = take("transformer.wte.weight", c, config_.vocab_size);
  wpe_.int8 = take("transformer.wpe.weight", c, config_.seq_len);
  int8_ = std::move(weights);
}

int64_t Gpt::weight_bytes() const {
  int64_t bytes = head_panels_ != nullptr ? head_panels_->bytes() : 0;
  for (const ParamInfo& p : params_.infos()) {
    if (head_panels_ != nullptr && p.name == "transformer.wte.weight") continue;  // read from the head's panels
    auto it = int8_.find(p.name);
    auto pt = panels_.find(p.name);
    bytes += it != int8_.end()    ? it->second->bytes()
             : pt != panels_.end() ? pt->second->bytes()
                                   : p.numel * static_cast<int64_t>(dtype_size(params_.dtype()));
  }
  return bytes;
}

void Gpt::use_panels() {
  LOOM_CHECK(part_.all_blocks && part_.embeddings && part_.head && !tp_.split() && params_.dtype() == DType::kF32 &&
             precision_ == DType::kF32 && !int8() && !panels());
  auto take = [&](Linear& layer, const std::string& name) {
    const Tensor w = params_.value(params_.find(name));
    auto panels = std::make_shared<const k::PanelMatrix>(k::pack_panels(false, layer.in, layer.out, w.data<float>(), layer.out));
    discard_pages(w.raw(), w.nbytes());  // forward reads the panels
    layer.panels = panels.get();
    panels_[name] = std::move(panels);
  };
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    Block& b = blocks_[l];
    const std::string prefix = cat("transformer.h.", l, ".");
    take(b.attn.c_attn, prefix + "attn.c_attn.weight");
    take(b.attn.c_proj, prefix + "attn.c_proj.weight");
    take(b.mlp.c_fc, prefix + "mlp.c_fc.weight");
    take(b.mlp.c_proj, prefix + "mlp.c_proj.weight");
  }
  // The tied head: logits = x @ wte^T. Its panels hold wte whole, so the embedding reads its
  // rows from them and the table goes back to the system.
  const Tensor wte = wte_.table.value();
  head_panels_ = std::make_shared<const k::PanelMatrix>(
      k::pack_panels(true, config_.d_model, wte_.rows, wte.data<float>(), config_.d_model));
  discard_pages(wte.raw(), wte.nbytes());
  wte_.panels = head_panels_.get();
}

}  // namespace loom::nn
