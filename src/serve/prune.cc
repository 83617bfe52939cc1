// Magnitude pruning of a GPT's linear layers (docs/serving.md, "Pruning"; loom/serve/prune.h).
// Unstructured: the smallest |w| of each weight matrix; rows: each layer's output channels
// (a column of the (in, out) matrix and its bias) of smallest L2 norm; heads: each
// attention layer's heads of smallest L2 norm (their q, k and v columns and biases, and
// their rows of the output projection).
#include "loom/serve/prune.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/core/error.h"

namespace loom::serve {
namespace {

// The k entries of `score` with the smallest values (ties broken by index, so the choice
// does not depend on the sort).
std::vector<int64_t> smallest(const std::vector<double>& score, int64_t k) {
  std::vector<int64_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto less = [&](int64_t a, int64_t b) { return score[a] < score[b] || (score[a] == score[b] && a < b); };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), less);
  idx.resize(static_cast<size_t>(k));
  return idx;
}

struct Linear {
  std::string name;  // the weight's, without ".weight"
  Tensor w;          // (in, out)
  Tensor b;          // (out)
};

// The linear layers of a GPT's blocks (the tied embedding and LayerNorms are not pruned).
std::vector<Linear> linears(nn::Gpt& gpt) {
  std::vector<Linear> out;
  const ParamSet& ps = gpt.params();
  for (int i = 0; i < static_cast<int>(ps.infos().size()); ++i) {
    const ParamInfo& p = ps.infos()[i];
    if (p.kind != ParamKind::kWeight || !p.name.ends_with(".weight")) continue;
    const std::string prefix = p.name.substr(0, p.name.size() - 7);
    const int b = ps.find(prefix + ".bias");
    out.push_back({prefix, ps.value(i), b >= 0 ? ps.value(b) : Tensor()});
  }
  return out;
}

// Zeroes output channel j of a layer.
void zero_channel(const Linear& l, int64_t j) {
  const int64_t in = l.w.dim(0), out = l.w.dim(1);
  float* w = l.w.data<float>();
  for (int64_t i = 0; i < in; ++i) w[i * out + j] = 0;
  if (l.b.defined()) l.b.data<float>()[j] = 0;
}

int64_t prune_unstructured(const std::vector<Linear>& layers, double sparsity) {
  int64_t zeroed = 0;
  for (const Linear& l : layers) {
    float* w = l.w.data<float>();
    std::vector<double> score(static_cast<size_t>(l.w.numel()));
    for (int64_t i = 0; i < l.w.numel(); ++i) score[i] = std::fabs(w[i]);
    const auto k = static_cast<int64_t>(sparsity * static_cast<double>(l.w.numel()));
    for (int64_t i : smallest(score, k)) w[i] = 0;
    zeroed += k;
  }
  return zeroed;
}

int64_t prune_rows(const std::vector<Linear>& layers, double sparsity) {
  int64_t zeroed = 0;
  for (const Linear& l : layers) {
    const int64_t in = l.w.dim(0), out = l.w.dim(1);
    const float* w = l.w.data<float>();
    std::vector<double> norm(static_cast<size_t>(out), 0.0);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < out; ++j) norm[j] += static_cast<double>(w[i * out + j]) * w[i * out + j];
    const auto k = static_cast<int64_t>(sparsity * static_cast<double>(out));
    for (int64_t j : smallest(norm, k)) zero_channel(l, j);
    zeroed += k * in;
  }
  return zeroed;
}

// Attention layer by layer: each block's attn.c_attn with the attn.c_proj after it.
int64_t prune_heads(const std::vector<Linear>& layers, int64_t n_head, double sparsity) {
  int64_t zeroed = 0;
  for (size_t li = 0; li + 1 < layers.size(); ++li) {
    if (!layers[li].name.ends_with("attn.c_attn")) continue;
    const Linear& qkv = layers[li];
    const Linear& proj = layers[li + 1];
    LOOM_CHECK(proj.name.ends_with("attn.c_proj"));
    const int64_t c = proj.w.dim(0), hd = c / n_head;
    std::vector<double> norm(static_cast<size_t>(n_head), 0.0);
    const float* a = qkv.w.data<float>();
    const float* p = proj.w.data<float>();
    for (int64_t h = 0; h < n_head; ++h) {
      for (int64_t i = 0; i < c; ++i)
        for (int64_t part = 0; part < 3; ++part)
          for (int64_t d = 0; d < hd; ++d) {
            const double x = a[i * 3 * c + part * c + h * hd + d];
            norm[h] += x * x;
          }
      for (int64_t r = h * hd; r < (h + 1) * hd; ++r)
        for (int64_t j = 0; j < c; ++j) norm[h] += static_cast<double>(p[r * c + j]) * p[r * c + j];
    }
    const auto k = static_cast<int64_t>(sparsity * static_cast<double>(n_head));
    for (int64_t h : smallest(norm, k)) {
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t d = 0; d < hd; ++d) zero_channel(qkv, part * c + h * hd + d);
      float* pw = proj.w.data<float>();
      std::fill(pw + h * hd * c, pw + (h + 1) * hd * c, 0.0f);
    }
    zeroed += k * hd * 4 * c;
  }
  return zeroed;
}

}  // namespace

Pruned prune_gpt(nn::Gpt& gpt, double sparsity, Structure structure) {
  LOOM_CHECK(sparsity >= 0 && sparsity < 1);
  const std::vector<Linear> layers = linears(gpt);
  Pruned r;
  for (const Linear& l : layers) r.total += l.w.numel();
  r.removed = structure == Structure::kRows    ? prune_rows(layers, sparsity)
              : structure == Structure::kHeads ? prune_heads(layers, gpt.config().n_head, sparsity)
                                               : prune_unstructured(layers, sparsity);
  for (const Linear& l : layers) r.zeros += std::count(l.w.data<float>(), l.w.data<float>() + l.w.numel(), 0.0f);
  return r;
}

Structure structure_named(const std::string& name) {
  if (name == "none") return Structure::kNone;
  if (name == "rows") return Structure::kRows;
  if (name == "heads") return Structure::kHeads;
  throw InputError(cat("--structured ", printable(name), ": expected none, rows or heads"));
}

std::vector<uint8_t> zero_mask(const ParamSet& params) {
  std::vector<uint8_t> mask(static_cast<size_t>(params.numel()), 0);
  const float* v = params.values().data<float>();
  for (const ParamInfo& p : params.infos())
    if (p.kind == ParamKind::kWeight || p.kind == ParamKind::kBias)
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) mask[i] = v[i] == 0.0f ? 1 : 0;
  return mask;
}

void apply_zero_mask(const ParamSet& params, const std::vector<uint8_t>& mask) {
  float* v = params.values().data<float>();
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) v[i] = 0.0f;
}

}  // namespace loom::serve
