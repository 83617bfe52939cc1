#include "nn/mixed.h"

#include <map>

#include "kernels/precision.h"

namespace loom::nn::mixed {
namespace k = loom::kernels;

void round_values(const Tensor& t, DType format) {
  if (format != DType::kF32) k::round_to(format, t.data<float>(), t.numel());
}

Tensor to_half(const Tensor& x, DType format, Arena& arena) {
  LOOM_CHECK(x.dtype() == DType::kF32);
  Tensor out = arena.alloc(x.shape(), format);
  k::store_half(format, out.data<uint16_t>(), x.data<float>(), x.numel());
  return out;
}

Tensor to_f32(const Tensor& x, Arena& arena) {
  LOOM_CHECK(x.dtype() == DType::kBF16 || x.dtype() == DType::kF16);
  Tensor out = arena.alloc(x.shape(), DType::kF32);
  k::load_half(x.dtype(), out.data<float>(), x.data<uint16_t>(), x.numel());
  return out;
}

namespace {

// Every tensor a block's context keeps for its backward, and whether it is a per-row
// statistic (kept in f32).
template <typename F>
void for_each_kept(BlockCtx& c, F&& f) {
  for (LayerNormCtx* ln : {&c.ln_1, &c.ln_2}) {
    f(ln->x, false);
    f(ln->mean, true);
    f(ln->rstd, true);
  }
  for (LinearCtx* lin : {&c.attn.c_attn, &c.attn.c_proj, &c.mlp.c_fc, &c.mlp.c_proj}) f(lin->x, false);
  f(c.attn.qkv, false);
  f(c.attn.y, false);
  f(c.attn.lse, true);
  f(c.mlp.gelu.x, false);
}

}  // namespace

void keep_half(BlockCtx& ctx, DType format, const Tensor& input, const Tensor& input_half, Arena& arena) {
  std::map<const void*, Tensor> moved{{input.raw(), input_half}};
  for_each_kept(ctx, [&](Tensor& t, bool statistic) {
    if (!t.defined()) return;
    auto [it, fresh] = moved.try_emplace(t.raw());
    LOOM_CHECK(fresh || it->second.numel() == t.numel());  // a tensor kept twice, never a part of one
    if (fresh) {
      if (statistic) {
        it->second = arena.alloc(t.shape(), t.dtype());
        it->second.copy_from(t);
      } else {
        it->second = to_half(t, format, arena);
      }
    }
    t = it->second.view(t.shape());
  });
}

void load_f32(BlockCtx& ctx, Arena& workspace) {
  std::map<const void*, Tensor> loaded;
  for_each_kept(ctx, [&](Tensor& t, bool /*statistic*/) {
    if (!t.defined() || t.dtype() == DType::kF32) return;
    auto [it, fresh] = loaded.try_emplace(t.raw());
    if (fresh) it->second = to_f32(t, workspace);
    LOOM_CHECK(it->second.numel() == t.numel());
    t = it->second.view(t.shape());
  });
}

}  // namespace loom::nn::mixed
