// A GPT as an ONNX graph (opset 17; docs/formats.md, "ONNX"): include/loom/serve/onnx.h.
// Input `input_ids` (batch, sequence) int64, output `logits` (batch, sequence, vocab)
// float; the weights are initializers with their Hugging Face names. The file is protobuf,
// written here field by field from onnx.proto's numbers: Loom only writes this one message
// shape and never parses one, so a few lines of encoding replace a dependency on
// libprotobuf and generated code (docs/formats.md says why).
#include "loom/serve/onnx.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "loom/core/error.h"

namespace loom::serve {
namespace {

// Protobuf wire format: a message is a string of (field number << 3 | wire type, value).
class Message {
 public:
  Message& varint(int field, uint64_t v) {
    key(field, 0);
    put_varint(v);
    return *this;
  }
  Message& fixed32(int field, float f) {
    key(field, 5);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(bits >> (8 * i)));
    return *this;
  }
  Message& bytes(int field, std::string_view s) {
    key(field, 2);
    put_varint(s.size());
    out_.append(s);
    return *this;
  }
  Message& message(int field, const Message& m) { return bytes(field, m.out_); }
  const std::string& str() const { return out_; }

 private:
  void key(int field, int wire) { put_varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
  void put_varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>(v | 0x80));
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// onnx.proto field numbers and enums.
enum TensorType { kFloat = 1, kInt64 = 7 };
enum AttrType { kAttrFloat = 1, kAttrInt = 2, kAttrInts = 7 };

struct Attr {
  std::string name;
  AttrType type;
  float f = 0;
  std::vector<int64_t> ints;  // one for kAttrInt
};

class Graph {
 public:
  // A node; returns its (first) output's name: `named`, or one made up.
  std::string node(const std::string& op, std::vector<std::string> inputs, std::vector<Attr> attrs = {},
                   int outputs = 1, const std::string& named = "") {
    Message n;
    for (const std::string& in : inputs) n.bytes(1, in);
    std::string first;
    for (int i = 0; i < outputs; ++i) {
      const std::string name = !named.empty() ? named : cat(op, "_", count_, outputs > 1 ? cat("_", i) : "");
      if (i == 0) first = name;
      n.bytes(2, name);
    }
    n.bytes(3, cat(op, "_", count_++)).bytes(4, op);
    for (const Attr& a : attrs) {
      Message m;
      m.bytes(1, a.name).varint(20, a.type);
      if (a.type == kAttrFloat) m.fixed32(2, a.f);
      if (a.type == kAttrInt) m.varint(3, static_cast<uint64_t>(a.ints.at(0)));
      if (a.type == kAttrInts)
        for (int64_t v : a.ints) m.varint(8, static_cast<uint64_t>(v));
      n.message(5, m);
    }
    graph_.message(1, n);
    return first;
  }
  // The outputs of a node with several, by index (node() returned the first).
  static std::string output(const std::string& first, int i) { return first.substr(0, first.size() - 1) + std::to_string(i); }

  std::string floats(const std::string& name, const Shape& shape, const float* data) {
    Message t;
    for (int64_t d : shape) t.varint(1, static_cast<uint64_t>(d));
    t.varint(2, kFloat).bytes(8, name).bytes(9, std::string_view(reinterpret_cast<const char*>(data), 4 * shape_numel(shape)));
    graph_.message(5, t);
    return name;
  }
  std::string scalar(float v) { return floats(cat("const_", count_++), {}, &v); }
  std::string int64s(const std::vector<int64_t>& v) {
    Message t;
    t.varint(1, v.size()).varint(2, kInt64).bytes(8, cat("const_", count_)).bytes(
        9, std::string_view(reinterpret_cast<const char*>(v.data()), 8 * v.size()));
    graph_.message(5, t);
    return cat("const_", count_++);
  }
  // A graph input or output: its element type and shape (dims: a number, or a name for a symbolic one).
  void value(int field, const std::string& name, TensorType type, const std::vector<std::string>& dims) {
    Message shape;
    for (const std::string& d : dims) {
      Message dim;
      if (std::isdigit(static_cast<unsigned char>(d[0]))) dim.varint(1, std::stoull(d));
      else dim.bytes(2, d);
      shape.message(1, dim);
    }
    Message tensor, type_proto, info;
    tensor.varint(1, type).message(2, shape);
    type_proto.message(1, tensor);
    info.bytes(1, name).message(2, type_proto);
    graph_.message(field, info);
  }
  std::string model(const std::string& name) {
    graph_.bytes(2, name);
    Message opset, m;
    opset.bytes(1, "").varint(2, 17);
    m.varint(1, 8).bytes(2, "loom").message(7, graph_).message(8, opset);  // IR version 8 (onnx 1.12)
    return m.str();
  }

 private:
  Message graph_;
  int count_ = 0;
};

Attr ints(const std::string& name, std::vector<int64_t> v) { return {name, kAttrInts, 0, std::move(v)}; }
Attr one(const std::string& name, int64_t v) { return {name, kAttrInt, 0, {v}}; }

}  // namespace

std::string onnx_graph(const nn::Gpt& gpt) {
  const nn::GptConfig& g = gpt.config();
  const int64_t c = g.d_model, h = g.n_head, hs = c / h;
  Graph gr;
  const ParamSet& ps = gpt.params();
  auto weight = [&](const std::string& name) {
    const ParamInfo& p = ps.infos()[ps.find(name)];
    return gr.floats(name, p.shape, ps.value(ps.find(name)).data<float>());
  };
  auto layer_norm = [&](const std::string& x, const std::string& prefix) {
    return gr.node("LayerNormalization", {x, weight(prefix + ".weight"), weight(prefix + ".bias")},
                   {one("axis", -1), {"epsilon", kAttrFloat, 1e-5f, {}}});
  };
  auto linear = [&](const std::string& x, const std::string& prefix) {
    return gr.node("Add", {gr.node("MatMul", {x, weight(prefix + ".weight")}), weight(prefix + ".bias")});
  };
  const std::string wte = weight("transformer.wte.weight");
  // Positions 0 .. T-1 of the input's length, their rows of wpe added to the tokens'.
  const std::string t = gr.node("Gather", {gr.node("Shape", {"input_ids"}), gr.int64s({1})}, {one("axis", 0)});
  const std::string zero = gr.int64s({0});
  const std::string positions = gr.node("Range", {gr.node("Squeeze", {zero}), gr.node("Squeeze", {t}),
                                                  gr.node("Squeeze", {gr.int64s({1})})});
  std::string x = gr.node("Add", {gr.node("Gather", {wte, "input_ids"}),
                                  gr.node("Gather", {weight("transformer.wpe.weight"), positions})});
  // The causal mask: 0 on and below the diagonal, -inf above, cut to T x T.
  std::vector<float> mask(static_cast<size_t>(g.seq_len * g.seq_len), 0.0f);
  for (int64_t i = 0; i < g.seq_len; ++i)
    for (int64_t j = i + 1; j < g.seq_len; ++j) mask[i * g.seq_len + j] = -std::numeric_limits<float>::infinity();
  const std::string tt = gr.node("Concat", {t, t}, {one("axis", 0)});
  const std::string causal = gr.node("Slice", {gr.floats("causal_mask", {g.seq_len, g.seq_len}, mask.data()),
                                               gr.int64s({0, 0}), tt});
  const std::string heads = gr.int64s({0, 0, h, hs}), merged = gr.int64s({0, 0, c});
  const std::string scale = gr.scalar(static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs))));
  for (int64_t l = 0; l < g.n_layer; ++l) {
    const std::string p = cat("transformer.h.", l, ".");
    const std::string qkv = linear(layer_norm(x, p + "ln_1"), p + "attn.c_attn");
    const std::string split = gr.node("Split", {qkv, gr.int64s({c, c, c})}, {one("axis", 2)}, 3);
    auto as_heads = [&](int i, std::vector<int64_t> perm) {
      return gr.node("Transpose", {gr.node("Reshape", {Graph::output(split, i), heads})}, {ints("perm", std::move(perm))});
    };
    const std::string q = as_heads(0, {0, 2, 1, 3}), k = as_heads(1, {0, 2, 3, 1}), v = as_heads(2, {0, 2, 1, 3});
    const std::string att = gr.node("Softmax", {gr.node("Add", {gr.node("Mul", {gr.node("MatMul", {q, k}), scale}), causal})},
                                    {one("axis", -1)});
    const std::string y = gr.node("Reshape", {gr.node("Transpose", {gr.node("MatMul", {att, v})}, {ints("perm", {0, 2, 1, 3})}),
                                              merged});
    x = gr.node("Add", {x, linear(y, p + "attn.c_proj")});
    // GELU, tanh form: 0.5 u (1 + tanh(sqrt(2 / pi) (u + 0.044715 u^3)))
    const std::string u = linear(layer_norm(x, p + "ln_2"), p + "mlp.c_fc");
    const std::string cube = gr.node("Mul", {gr.node("Mul", {u, u}), u});
    const std::string inner = gr.node("Mul", {gr.node("Add", {u, gr.node("Mul", {cube, gr.scalar(0.044715f)})}),
                                              gr.scalar(static_cast<float>(std::sqrt(2.0 / M_PI)))});
    const std::string gelu = gr.node("Mul", {gr.node("Mul", {u, gr.scalar(0.5f)}),
                                             gr.node("Add", {gr.node("Tanh", {inner}), gr.scalar(1.0f)})});
    x = gr.node("Add", {x, linear(gelu, p + "mlp.c_proj")});
  }
  const std::string head = gr.node("Transpose", {wte}, {ints("perm", {1, 0})});
  gr.node("MatMul", {layer_norm(x, "transformer.ln_f"), head}, {}, 1, "logits");
  gr.value(11, "input_ids", kInt64, {"batch", "sequence"});
  gr.value(12, "logits", kFloat, {"batch", "sequence", std::to_string(g.vocab_size)});
  return gr.model("loom-gpt");
}
}  // namespace loom::serve
