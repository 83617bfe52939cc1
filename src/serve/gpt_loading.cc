// Loading a GPT from a checkpoint or a bare safetensors file to generate with or evaluate
// (include/loom/serve/gpt_loading.h), with int8 weights where a checkpoint holds them.
#include "loom/serve/gpt_loading.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include "kernels/int8_matmul.h"
#include "loom/core/error.h"
#include "loom/core/log.h"

namespace loom::serve {
namespace {

namespace k = loom::kernels;

// The block ids of a checkpoint's weights named [transformer.]h.<id>.*; names that are not
// blocks are ignored.
std::set<int64_t> block_ids(const checkpoint::Checkpoint& ck) {
  std::set<int64_t> ids;
  for (const auto& e : ck.tensors()) {
    if (e.part != checkpoint::Part::kModel) continue;
    const std::string n = e.name.starts_with("transformer.") ? e.name.substr(12) : e.name;
    const size_t dot = n.find('.', 2);
    if (!n.starts_with("h.") || dot == std::string::npos || dot == 2 || dot > 11) continue;
    const std::string digits = n.substr(2, dot - 2);
    if (digits.find_first_not_of("0123456789") == std::string::npos) ids.insert(std::stoll(digits));
  }
  return ids;
}


}  // namespace

std::optional<data::Tokenizer> model_tokenizer(const checkpoint::Checkpoint& ck, const std::string& spec, int64_t vocab) {
  std::optional<data::Tokenizer> t;
  std::string from = spec;
  if (!spec.empty()) {
    t = data::Tokenizer::load(spec);
  } else if (auto enc = ck.extra_file("tokenizer/encoder.json"); enc) {
    const auto bpe = ck.extra_file("tokenizer/vocab.bpe");
    if (!bpe) throw InputError(cat(index_of(ck), ": lists tokenizer/encoder.json but not tokenizer/vocab.bpe"));
    const std::string dir = (std::filesystem::path(ck.path()) / "tokenizer").string();
    t = data::Tokenizer::parse_gpt2_files(*enc, *bpe, dir, dir);
    from = dir;
  } else if (vocab <= 256) {
    t = data::Tokenizer::bytes();
    from = "bytes";
  }
  if (t && t->vocab_size() > vocab)
    throw InputError(cat("tokenizer ", printable(from), " has ", t->vocab_size(), " ids, but the model's vocabulary is ",
                         vocab, " (", index_of(ck), ")"));
  return t;
}

std::vector<uint8_t> newlines_per_token(const data::Tokenizer& t) {
  std::vector<uint8_t> n(static_cast<size_t>(t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const std::string_view b = t.token_bytes(id);
    n[id] = static_cast<uint8_t>(std::min<ptrdiff_t>(255, std::count(b.begin(), b.end(), '\n')));
  }
  return n;
}

std::string index_of(const checkpoint::Checkpoint& ck) {
  return ck.format_version() == 0 ? ck.path() : (std::filesystem::path(ck.path()) / "index.json").string();
}

nn::GptConfig gpt_shape_of(const checkpoint::Checkpoint& ck, int64_t n_head) {
  // What errors about the weights name: the file, or the checkpoint's directory.
  const std::string f_path = index_of(ck);
  auto find = [&](const std::string& name) {
    std::optional<checkpoint::TensorInfo> e = ck.find("transformer." + name);
    if (!e || e->shape.size() != 2)
      throw InputError(cat(f_path, ": no 2-D tensor ", name, " (expected GPT-2 weights with Hugging Face names)"));
    return *e;
  };
  const checkpoint::TensorInfo wte = find("wte.weight");
  const checkpoint::TensorInfo wpe = find("wpe.weight");
  const std::set<int64_t> blocks = block_ids(ck);
  nn::GptConfig g;
  std::string from;
  const bool from_state = ck.has_state() && !ck.state().model.is_null();
  if (from_state) {
    const nlohmann::json& m = ck.state().model;  // fields validated by Checkpoint::open
    from = (std::filesystem::path(ck.path()) / "state.json").string() + ": model";
    if (m["kind"] != "gpt") throw InputError(cat(from, ".kind = ", m["kind"].dump(), ": expected \"gpt\""));
    g = {.n_layer = m["n_layer"].get<int64_t>(), .n_head = m["n_head"].get<int64_t>(),
         .d_model = m["d_model"].get<int64_t>(), .seq_len = m["seq_len"].get<int64_t>(),
         .vocab_size = m["vocab_size"].get<int64_t>()};
  } else {
    from = f_path;
    g = {.n_layer = static_cast<int64_t>(blocks.size()), .n_head = n_head, .d_model = wte.shape[1],
         .seq_len = wpe.shape[0], .vocab_size = wte.shape[0]};
    if (g.d_model > 0 && g.d_model % g.n_head != 0)
      throw InputError(cat(f_path, ": d_model ", g.d_model, " is not divisible by model.n_head = ", g.n_head,
                           " (set it with --model.n_head=N or a config)"));
  }
  if (const std::string problem = nn::gpt_config_problem(g); !problem.empty())
    throw InputError(cat(from, from_state ? "." : ": ", problem));
  for (const auto& [e, want] : {std::pair{wte, Shape{g.vocab_size, g.d_model}}, std::pair{wpe, Shape{g.seq_len, g.d_model}}})
    if (e.shape != want)
      throw InputError(cat(f_path, ": tensor ", e.name, " has shape ", shape_str(e.shape), ", the model shape (",
                           from_state ? from : "read off wte and wpe", ": vocab_size ", g.vocab_size, ", seq_len ",
                           g.seq_len, ", d_model ", g.d_model, ") needs ", shape_str(want)));
  if (blocks.size() != static_cast<size_t>(g.n_layer) || (!blocks.empty() && *blocks.rbegin() != g.n_layer - 1))
    throw InputError(cat(from, ": n_layer = ", g.n_layer, ", but ", f_path, " holds blocks ",
                         blocks.empty() ? std::string("none") : cat(*blocks.begin(), "..", *blocks.rbegin(), " (",
                                                                     blocks.size(), " of them)")));
  return g;
}

std::unique_ptr<nn::Gpt> load_gpt(const checkpoint::Checkpoint& ck, int64_t n_head, bool int8) {
  const nn::GptConfig shape = gpt_shape_of(ck, n_head);
  auto gpt = std::make_unique<nn::Gpt>(shape);
  if (holds_int8(ck))
    load_int8(ck, *gpt);
  else
    ck.load_params(gpt->params());
  if (const std::string bad = ck.nonfinite_report(); !bad.empty())
    log_warn(cat(bad, "; what the model computes from them is not meaningful"));
  if (int8 && !gpt->int8()) gpt->use_int8(gpt->quantize_int8());
  return gpt;
}

std::unique_ptr<nn::Gpt> load_gpt_for_decoding(const checkpoint::Checkpoint& ck, int64_t n_head, bool int8) {
  auto gpt = load_gpt(ck, n_head, int8);
  if (!gpt->int8()) gpt->use_panels();
  return gpt;
}

bool holds_int8(const checkpoint::Checkpoint& ck) {
  std::optional<checkpoint::TensorInfo> wte = ck.find("transformer.wte.weight");
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
    std::optional<checkpoint::TensorInfo> q = ck.find(name), s = ck.find(name + kInt8ScaleSuffix);
    const bool rows = nn::Gpt::int8_by_rows(name);
    const int64_t channels = rows ? p.shape[0] : p.shape[1], depth = rows ? p.shape[1] : p.shape[0];
    if (!q || q->dtype != DType::kI8 || q->shape != p.shape)
      throw InputError(cat(file, ": tensor ", name, ": expected I8 of shape ", shape_str(p.shape), " (an int8 checkpoint)",
                           q ? cat(", found ", safetensors_dtype_name(q->dtype), " ", shape_str(q->shape)) : ""));
    if (!s || s->shape != Shape{channels})
      throw InputError(cat(file, ": tensor ", name, kInt8ScaleSuffix, ": expected ", channels, " scales (F32)",
                           s ? cat(", found shape ", shape_str(s->shape)) : ", found none"));
    const Tensor values = ck.read(name, DType::kI8), scales = ck.read(name + kInt8ScaleSuffix, DType::kF32);
    k::Int8Weight w = k::make_int8_weight(depth, channels);
    for (int64_t j = 0; j < channels; ++j) {
      const float scale = scales.data<float>()[j];
      if (!(scale >= 0) || !std::isfinite(scale))
        throw InputError(cat(file, ": tensor ", name, kInt8ScaleSuffix, "[", j, "] = ", scale, ": expected a finite scale >= 0"));
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

}  // namespace loom::serve
