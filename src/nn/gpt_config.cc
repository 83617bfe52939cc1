// A GPT's shape and what follows from it before one is built (loom/nn/gpt_config.h).
#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/nn/gpt_config.h"

namespace loom::nn {

std::string gpt_config_problem(const GptConfig& g) {
  const std::pair<const char*, int64_t> fields[] = {{"n_layer", g.n_layer}, {"n_head", g.n_head},
                                                    {"d_model", g.d_model}, {"seq_len", g.seq_len},
                                                    {"vocab_size", g.vocab_size}};
  for (const auto& [name, v] : fields)
    if (v < 1 || v > INT32_MAX) return cat(name, " = ", v, ": expected an integer in [1, ", INT32_MAX, "]");
  if (g.d_model % g.n_head != 0) return cat("d_model = ", g.d_model, ": not divisible by n_head = ", g.n_head);
  const double params = gpt_counts(g).total();
  if (params > 0x1p40)
    return cat("d_model = ", g.d_model, " with n_layer = ", g.n_layer, ", vocab_size = ", g.vocab_size, " and seq_len = ",
               g.seq_len, ": ", params, " parameters; expected at most 2^40");
  return "";
}

double GptCounts::total() const { return embeddings + total_blocks + head; }

GptCounts gpt_counts(const GptConfig& g, int tp) {
  const auto c = static_cast<double>(g.d_model);
  GptCounts n;
  n.embeddings = (static_cast<double>(g.vocab_size) / tp + static_cast<double>(g.seq_len)) * c;  // wte vocab-parallel
  // ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj with biases: 12 C^2 + 13 C. A
  // tensor-parallel piece holds 1/tp of the matrices and of c_attn's and c_fc's biases; the
  // LayerNorms and the row-parallel projections' biases whole.
  n.block = (12 * c * c + 7 * c) / tp + 6 * c;
  n.total_blocks = static_cast<double>(g.n_layer) * n.block;
  n.head = 2 * c;
  return n;
}

ActivationBytes gpt_activation_bytes(const GptConfig& g, int64_t blocks, GptEnds ends, int64_t b, int64_t t,
                                     Recompute recompute, bool with_backward, int tp, bool sequence_parallel,
                                     DType precision) {
  // Each term is one arena allocation of the code above and in layers.cc, rounded up to the
  // arena's 64-byte alignment; f32 (and i32 positions), but for mixed precision's 16-bit copies.
  auto a = [](double elements) { return std::ceil(elements * 4 / 64) * 64; };
  const double n = static_cast<double>(b) * static_cast<double>(t), c = static_cast<double>(g.d_model);
  const double p = c / tp;  // a tensor-parallel piece's share of the channels (heads, MLP)
  // The rows of the residual stream a piece holds: sequence parallelism keeps 1 / tp of them.
  const bool sp = sequence_parallel && tp > 1;
  const double r = sp ? n / tp : n;
  const double lse = static_cast<double>(b) * static_cast<double>(g.n_head / tp) * static_cast<double>(t);
  // One block without recompute: forward keeps ln_1 (mean, rstd, y), qkv, the attention's
  // log-sum-exp per row and head, the heads' output, c_proj's output, ln_2 (mean, rstd,
  // y), c_fc, GELU and c_proj's outputs; backward adds every d(input) on the way back (the
  // attention recomputes its probabilities block by block in per-thread scratch: no (T, T)
  // matrix). Split over tp pieces, qkv, the heads and the MLP's hidden layer are a piece's
  // share; what the projections give back is r rows.
  const double block_fwd = 2 * a(r) + a(r * c) + a(3 * n * p) + a(lse) + a(n * p) + a(r * c) + 2 * a(r) +
                           a(r * c) + a(4 * n * p) + a(4 * n * p) + a(r * c);
  const double block_bwd = a(4 * n * p) + a(4 * n * p) + a(r * c) + a(r * c) + a(n * p) + a(3 * n * p) +
                           a(r * c) + a(r * c);
  ActivationBytes out;
  const auto l = static_cast<double>(blocks);
  if (precision != DType::kF32) {
    // Mixed precision (forward_blocks_mixed): the arena keeps the input and each block's
    // output in 16 bits and the last output in f32; a block keeps 16-bit copies of its
    // tensors (attn.y once) and f32 copies of its statistics; backward adds one f32 d(input).
    // The workspace holds one block in f32 and the kept tensors loaded back (the products
    // round the weights as they pack them: no copies), but for what the backward reads in
    // 16 bits: the GELU's and the LayerNorms' inputs, the attention's qkv and output, and the
    // Linears' inputs (nn/mixed.h; with sequence parallelism the Linears' are loaded: c_attn's,
    // c_fc's, both c_projs'). Unsplit, c_fc writes
    // the GELU's output in 16 bits (nn::Linear::forward_gelu): in the workspace under full
    // recompute, else straight into the arena with c_fc's output, which the keep counts.
    auto h = [](double elements) { return std::ceil(elements * 2 / 64) * 64; };
    const double keep = 4 * a(r) + a(lse) + 3 * h(r * c) + h(n * p) + 2 * h(4 * n * p) + h(3 * n * p) + h(r * c);
    const double loaded = sp ? 2 * a(r * c) + a(4 * n * p) + a(n * p) : 0;
    const double gelu_bits = tp == 1 ? a(4 * n * p) - h(4 * n * p) : 0;
    const double forward = a(r * c) + block_fwd - gelu_bits;
    out.arena = h(r * c) + a(r * c) + (with_backward ? a(r * c) : 0);
    if (ends.embeddings) out.workspace = 2 * a(r * c);  // wte's and wpe's outputs, summed
    if (recompute == Recompute::kFull) {
      out.arena += l * h(r * c);
      if (blocks > 0) out.workspace = std::max(out.workspace, forward + (with_backward ? block_bwd : 0));
    } else {
      out.arena += l * keep;
      // Unsplit, c_fc's output and GELU and the LayerNorms' outputs are written straight
      // into the arena in 16 bits: the workspace never holds them.
      const double gelu_kept = tp == 1 ? h(4 * n * p) + 2 * a(r * c) : 0;
      // And the heads write only their output's bits (attention_forward_bits), from qkv's.
      const double heads_bits = tp == 1 ? a(n * p) : 0;
      // Backward hands the MLP's gradient from c_proj to c_fc in 16 bits (nn::Linear::
      // backward_gelu), but where sequence parallelism gathers c_fc's input in f32.
      const double mlp_bits = sp ? 0 : a(4 * n * p) - h(4 * n * p);
      // And the attention's dqkv to c_attn in 16 bits, unsplit (CausalSelfAttention::backward).
      const double qkv_bits = tp == 1 ? a(3 * n * p) - h(3 * n * p) : 0;
      const double backward = with_backward ? loaded + block_bwd - mlp_bits - qkv_bits : 0;
      if (blocks > 0) out.workspace = std::max({out.workspace, forward - gelu_kept - heads_bits, backward});
    }
  } else if (recompute != Recompute::kFull) {  // selective: nothing of the attention left to drop
    out.arena = l * (block_fwd + (with_backward ? block_bwd : 0));
  } else {  // each block keeps its output (and, in backward, its d(input)); the workspace one block
    out.arena = l * (a(r * c) + (with_backward ? a(r * c) : 0));
    out.workspace = blocks > 0 ? block_fwd + (with_backward ? block_bwd : 0) : 0;
  }
  // Vocab-parallel (tp > 1): wte's lookup keeps the ids by their place in this piece, and
  // the loss each row's max, sum of exponentials and target logit over the pieces.
  const double split = tp > 1 ? 1 : 0;
  // positions, wte and wpe outputs (mixed precision: in the workspace)
  if (ends.embeddings) out.arena += a(n) + (precision == DType::kF32 ? 2 * a(r * c) : 0) + split * a(n);
  if (ends.head) {
    const double v = static_cast<double>(g.vocab_size / tp);
    // ln_f, (sequence-parallel) its output gathered, logits, losses
    out.arena += 2 * a(r) + a(r * c) + (sp ? a(n * c) : 0) + a(n * v) + a(n) + split * a(3 * n);
    if (with_backward) out.arena += 2 * a(r * c);  // d(ln_f output), d(ln_f input)
  }
  // Sequence parallelism's staging: a gathered input or a partial output of every row, and
  // in a column-parallel backward both at once.
  if (sp) out.staging = (with_backward && blocks > 0 ? 2 : 1) * a(n * c);
  return out;
}

Recompute recompute_named(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw InputError(cat("recompute \"", name, "\": expected none, selective or full"));
}

}  // namespace loom::nn
