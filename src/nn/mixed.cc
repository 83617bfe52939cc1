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

// How a block's backward reads a tensor its context keeps.
enum class Kept {
  kStatistic,   // per-row statistics: kept in f32
  kLinearBits,  // kept in 16 bits, read as such where the Linear's backward can (only its
                // weight gradient reads it, packing the bits), else back to f32 before it
  kBits,        // kept in 16 bits and read as such: the GELU's and the LayerNorms' inputs,
                // the attention's qkv and output
};

// Every tensor a block's context keeps for its backward, and how it is read.
template <typename F>
void for_each_kept(BlockCtx& c, F&& f) {
  for (LayerNormCtx* ln : {&c.ln_1, &c.ln_2}) {
    f(ln->x, Kept::kBits);
    f(ln->mean, Kept::kStatistic);
    f(ln->rstd, Kept::kStatistic);
  }
  for (LinearCtx* lin : {&c.attn.c_attn, &c.mlp.c_fc, &c.mlp.c_proj}) f(lin->x, Kept::kLinearBits);
  f(c.attn.c_proj.x, Kept::kLinearBits);  // the attention's output (attn.y) as c_proj's input
  f(c.attn.qkv, Kept::kBits);
  f(c.attn.y, Kept::kBits);
  f(c.attn.lse, Kept::kStatistic);
  f(c.mlp.gelu.x, Kept::kBits);
}

}  // namespace

void keep_half(BlockCtx& ctx, DType format, const Tensor& input, const Tensor& input_half, Arena& arena) {
  std::map<const void*, Tensor> moved{{input.raw(), input_half}};
  for_each_kept(ctx, [&](Tensor& t, Kept kept) {
    if (!t.defined()) return;
    auto [it, fresh] = moved.try_emplace(t.raw());
    LOOM_CHECK(fresh || it->second.numel() == t.numel());  // a tensor kept twice, never a part of one
    if (fresh) {
      if (t.dtype() != DType::kF32) {  // 16 bits already, written to the arena (Block::forward's `kept`)
        it->second = t;
      } else if (kept == Kept::kStatistic) {
        it->second = arena.alloc(t.shape(), t.dtype());
        it->second.copy_from(t);
      } else {
        it->second = to_half(t, format, arena);
      }
    }
    t = it->second.view(t.shape());
  });
}

void load_f32(BlockCtx& ctx, Arena& workspace, bool linear_bits) {
  std::map<const void*, Tensor> loaded;
  const auto bits = [&](Kept kept) { return kept == Kept::kBits || (kept == Kept::kLinearBits && linear_bits); };
  for_each_kept(ctx, [&](Tensor& t, Kept kept) {
    if (!t.defined() || t.dtype() == DType::kF32 || bits(kept)) return;
    auto [it, fresh] = loaded.try_emplace(t.raw());
    if (fresh) it->second = to_f32(t, workspace);
    LOOM_CHECK(it->second.numel() == t.numel());
    t = it->second.view(t.shape());
  });
}

}  // namespace loom::nn::mixed
