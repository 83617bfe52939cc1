// GPT: the GPT-2 architecture (learned positional embeddings, pre-LayerNorm blocks, 4x GELU
// MLP, final LayerNorm, output projection tied to the token embedding), with Hugging Face
// GPT-2 parameter names and layouts (transformer.wte.weight (V, C),
// transformer.h.0.attn.c_attn.weight (C, 3C), ...) so checkpoints load in the ecosystem.
//
// The model is an nn::Model (loom/nn/model.h): its blocks are the transformer blocks, the
// embedding wte + wpe, the head ln_f and the tied output projection; a pipeline stage holds
// a GptPart of them. Its shape and sizes are in loom/nn/gpt_config.h, the key/value memory
// of incremental decoding in loom/nn/kv_cache.h.
// Thread-safety: one thread drives a model; kernels parallelize internally.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/nn/gpt_config.h"
#include "loom/nn/kv_cache.h"
#include "loom/nn/layers.h"
#include "loom/nn/model.h"

namespace loom::nn {

// Everything one micro-batch's forward saves for its backward.
struct GptCtx : ModelCtx {
  Arena arena;
  Tensor positions;  // (B, T) i32
  EmbeddingCtx wte, wpe;
  std::vector<BlockCtx> blocks;
  LayerNormCtx ln_f;
  LinearCtx head;  // input of the tied output projection
  CrossEntropyCtx loss;
  Tensor logits;  // (B, T, V), or (B, 1, V) for last_only; overwritten by backward
  Tensor dlogits;  // kept by a backward_head that defers the head's weight gradients
  int64_t b = 0, t = 0;
};

class Gpt : public Model {
 public:
  // tp: tensor parallelism (attention heads, the MLP and the vocabulary of the tied
  // embedding, head and loss split over tp.parts; wpe and the LayerNorms replicated).
  explicit Gpt(const GptConfig& config, DType dtype = DType::kF32, GptPart part = {}, Shard tp = {});

  // GPT-2 initialisation: weights N(0, 0.02), residual projections (attn.c_proj,
  // mlp.c_proj) N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm weight 1 and bias 0.
  void init(uint64_t seed);

  // nn::Model. tokens, targets: (B, T) i32, T <= seq_len, ids < vocab_size (callers
  // validate at the data edge); the loss is the mean next-token cross-entropy. The contexts
  // are GptCtx. Blocks are the n_layer transformer blocks; block -1 of the hooks is wte,
  // wpe, ln_f and the tied head.
  ModelShape shape() const override;
  int64_t n_blocks() const override { return config_.n_layer; }
  std::vector<int64_t> block_offsets() const override;
  bool holds_block(int64_t block) const override;
  double forward_flops_per_example() const override;  // a window of seq_len tokens
  std::unique_ptr<ModelCtx> make_ctx() const override;
  double forward(const Tensor& tokens, const Tensor& targets, ModelCtx& ctx) const override;
  void backward(ModelCtx& ctx, double scale) const override;
  CrossEntropyCtx& loss_ctx(ModelCtx& ctx) const override;
  // Logits (B, T, V), or only the last position's (B, 1, V) when last_only. REQUIRES: not
  // tensor-parallel (a piece holds only its columns of the logits).
  Tensor forward_logits(const Tensor& tokens, GptCtx& ctx, bool last_only) const;
  // The same in two parts, so that a caller can take the logits a few rows at a time: the
  // final hidden states (B, T, C) after ln_f, in ctx; then the logits (rows, V) of `rows`
  // of them (rows, C) into `out`, the same bits as forward_logits' rows (a row's product
  // does not depend on the other rows). REQUIRES: not tensor-parallel.
  Tensor forward_hidden(const Tensor& tokens, GptCtx& ctx) const;
  void head_logits(const Tensor& rows, const Tensor& out) const;

  // Incremental decoding (the whole model in one process): an empty cache for up to seq_len
  // positions; then decode runs `tokens` (one or more) at positions cache.length onwards,
  // adds their keys and values to the cache and returns the logits (V) of the last one, in
  // `arena` (reset first). Each token costs one position's forward, not the window's; the
  // logits equal forward_logits over the cached tokens to rounding (the attention adds in
  // another order). REQUIRES: 1 <= tokens.size() <= capacity - length, ids < vocab_size.
  KvCache make_cache() const;  // seq_len positions, in a pool of its own
  // A cache for up to `capacity` positions (at most seq_len) from a shared pool; nullopt
  // when the pool has too few free pages.
  std::optional<KvCache> make_cache(const std::shared_ptr<KvPagePool>& pool, int64_t capacity) const;
  Tensor decode(std::span<const int32_t> tokens, KvCache& cache, Arena& arena) const;
  // Several sequences at once (continuous batching): sequence s runs tokens[s] against
  // caches[s]; their rows share every matrix product, each attends to its own cache. Returns
  // each sequence's last logits (S, V), the same bits as decoding each alone (the kernels
  // compute a row the same way whatever the other rows).
  Tensor decode_batch(std::span<const std::span<const int32_t>> tokens, std::span<KvCache* const> caches,
                      Arena& arena) const;
  // decode_batch with the sequences dealt out in groups of about equal rows (up to
  // arenas.size(), one per three sequences), each run whole by one compute thread (its
  // kernels a team of one), the logits (S, V) gathered into `arena`. One join per step
  // instead of one per kernel: when another process preempts a compute thread, the other
  // goes on with its own group instead of spinning at the next kernel's join. The same bits
  // as decode_batch. arenas: one per group, kept between calls. each_group(first, logits),
  // when given, is called for each group by the thread that decoded it, with the logits
  // (n, V) of sequences [first, first + n), so that what follows a sequence's forward
  // (sampling) runs beside the other groups too.
  using GroupLogits = std::function<void(int64_t first, const Tensor& logits)>;
  Tensor decode_grouped(std::span<const std::span<const int32_t>> tokens, std::span<KvCache* const> caches,
                        std::span<Arena> arenas, Arena& arena, const GroupLogits& each_group = {}) const;

  // The model in pieces (pipeline stages), each over what this part holds; begin resets the
  // context's arena before the first forward piece. Under sequence parallelism each block
  // gives and takes this piece's rows (B x T / parts, C). embed's output, under mixed
  // precision, lives in the workspace until forward_stage. defer_weights (zero-bubble
  // pipelines) is refused under mixed precision and full recompute.
  void begin(ModelCtx& ctx, int64_t b, int64_t t) const override;
  Shape activation_shape(int64_t b, int64_t t) const override;
  Tensor embed(const Tensor& tokens, ModelCtx& ctx) const override;
  Tensor forward_stage(int64_t lo, int64_t hi, const Tensor& x, ModelCtx& ctx) const override;
  double head(const Tensor& x, const Tensor& targets, ModelCtx& ctx) const override;  // ln_f, logits, loss
  Tensor backward_head(ModelCtx& ctx, double scale, bool defer_weights = false) const override;
  Tensor backward_stage(int64_t lo, int64_t hi, const Tensor& dy, ModelCtx& ctx,
                        bool defer_weights = false) const override;
  void backward_weights(int64_t lo, int64_t hi, bool head, const ModelCtx& ctx) const override;
  void backward_embed(const Tensor& dx, ModelCtx& ctx) const override;

  // INT8 weights for inference (docs/serving.md, "INT8 weights"): `weights` maps each name
  // of int8_weight_names() to its int8 form; forward, forward_logits and decode then
  // multiply by those (wte: the embedding's rows and the tied head), and the f32 copies'
  // memory is given back to the system (they read as 0). backward refuses. REQUIRES: the
  // whole model in one process (no tensor or pipeline split), f32, every name present with
  // its shape.
  using Int8Weights = std::map<std::string, std::shared_ptr<const kernels::Int8Weight>>;
  void use_int8(Int8Weights weights);
  // This model's f32 weights quantized, per output channel, for use_int8.
  Int8Weights quantize_int8() const;
  // What int8 covers: every block's attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj
  // weight (by output channel), and the embeddings transformer.wte.weight and
  // transformer.wpe.weight (by row; wte's rows are the tied head's output channels).
  std::vector<std::string> int8_weight_names() const;
  // Whether int8 weight `name` has its channels by rows (the embeddings, (rows, C)) rather
  // than by columns (a linear weight, (in, out)).
  static bool int8_by_rows(const std::string& name) {
    return name == "transformer.wte.weight" || name == "transformer.wpe.weight";
  }
  bool int8() const { return !int8_.empty(); }

  // f32 weights in panels for inference (docs/serving.md, "Panels"): every block's linear
  // weights and the tied head's (wte^T) laid out once as kernels::PanelMatrix, which
  // forward, forward_logits and decode then multiply by: the same bits, read as one stream
  // per 32 columns. The linear weights' f32 memory is given back to the system (they read
  // as 0); wte stays, for the embedding's rows. backward refuses. REQUIRES: the whole model
  // in one process, f32, no int8 weights.
  void use_panels();
  bool panels() const { return head_panels_ != nullptr; }

  // Bytes of the weights forward reads: int8 values and f32 scales where use_int8 put them,
  // panels where use_panels did (and the head's), f32 for the rest (biases, LayerNorms, wpe).
  int64_t weight_bytes() const;

  const GptConfig& config() const { return config_; }
  const GptPart& part() const { return part_; }
  // REQUIRES: not kFull with backward's defer_weights (the weight passes need the
  // activations full recompute discards).
  void set_recompute(Recompute mode);
  Recompute recompute() const { return recompute_; }
  // Mixed precision ([training] precision, docs/numerics.md, "Mixed precision"): kBF16 or
  // kF16 rounds every activation and every input gradient to the format's values as a layer
  // writes it, multiplies by weights rounded to it (the head's too), and keeps what backward
  // needs in 16 bits; each block then runs in the workspace, one at a time. Parameters,
  // their gradients, the arithmetic and the loss stay f32. kF32: none. REQUIRES: f32
  // parameters, not tensor-parallel, no int8 weights; backward's defer_weights is refused.
  void set_precision(DType format);
  DType precision() const { return precision_; }
  // Peak bytes of the workspace (full recompute's or mixed precision's: one block's
  // activations at a time).
  size_t recompute_peak_bytes() const { return scratch_.peak_bytes(); }
  ParamSet& params() override { return params_; }
  const ParamSet& params() const override { return params_; }
  // Forward FLOPs per token: 2 x matmul parameters (tied head counted, wpe not) plus
  // attention 4 x n_layer x d_model x T; training costs 3x this.
  double forward_flops_per_token(int64_t t) const;

 private:
  Tensor trunk(const Tensor& tokens, GptCtx& ctx) const;  // embeddings + blocks + ln_f
  // forward_blocks and backward_blocks under mixed precision.
  Tensor forward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& x, GptCtx& ctx) const;
  Tensor backward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& dy, GptCtx& ctx) const;
  Tensor sequence_rows(const Tensor& rows) const;         // this piece's rows under sequence parallelism, else all
  BlockCtx block_ctx(const GptCtx& ctx) const;            // a block's context, told the micro-batch's shape
  Tensor logits(const Tensor& h, GptCtx& ctx) const;      // the tied head: h @ wte^T
  void head_product(const Tensor& out, const Tensor& x) const;  // out (rows, V) = x (rows, C) @ wte^T

  GptConfig config_;
  GptPart part_;
  Shard tp_;
  ParamSet params_;
  Embedding wte_, wpe_;
  std::vector<Block> blocks_;  // by global id; the ones not held are empty
  LayerNorm ln_f_;
  CrossEntropy loss_;
  Recompute recompute_ = Recompute::kNone;
  DType precision_ = DType::kF32;
  mutable Arena scratch_;  // the workspace of full recompute and mixed precision; one thread drives a model
  Int8Weights int8_;       // use_int8's, which the layers point into
  // use_panels': by weight name, and the head's; the layers point into them.
  std::map<std::string, std::shared_ptr<const kernels::PanelMatrix>> panels_;
  std::shared_ptr<const kernels::PanelMatrix> head_panels_;
};

}  // namespace loom::nn
