// GPT: the GPT-2 architecture (learned positional embeddings, pre-LayerNorm blocks, 4x GELU
// MLP, final LayerNorm, output projection tied to the token embedding), with Hugging Face
// GPT-2 parameter names and layouts (transformer.wte.weight (V, C),
// transformer.h.0.attn.c_attn.weight (C, 3C), ...) so checkpoints load in the ecosystem.
//
// The model is a sequence of blocks; forward/backward run them in order (pipeline stages
// will be contiguous ranges of blocks). All parameters live in one flat ParamSet.
// Thread-safety: one thread drives a model; kernels parallelize internally.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/nn/layers.h"

namespace loom::nn {

struct GptConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 256;
  int64_t seq_len = 256;     // the longest context (rows of wpe)
  int64_t vocab_size = 256;
};

// Why `config` cannot be built, "" when it can: every field in [1, 2^31 - 1], d_model
// divisible by n_head, and at most 2^40 parameters. The message starts with the field, as
// "d_model = 0: expected ...", for the caller to prefix with the file or key it came from.
std::string gpt_config_problem(const GptConfig& config);

// Parameter counts of a GPT, before one is built (doubles: no shape overflows them).
struct GptCounts {
  double embeddings = 0;  // wte (V x C; V / tp x C for a piece) + wpe (T x C)
  double block = 0;       // one transformer block: 12 C^2 + 13 C
  double head = 0;        // ln_f; the output projection is wte, tied
  double total() const;
  double total_blocks = 0;  // n_layer x block
};
// tp: a tensor-parallel piece's counts (tp divides n_head and vocab_size).
GptCounts gpt_counts(const GptConfig& config, int tp = 1);

// Activation recompute ([training] recompute, docs/numerics.md): what forward keeps for
// backward. kSelective (recompute the attention scores and softmax) is what every mode
// does since the attention became blocked: its backward recomputes the probabilities block
// by block, and forward keeps only a log-sum-exp per row, so kSelective keeps what kNone
// keeps. kFull keeps only each block's input and reruns the block's forward in backward. Gradients are bitwise equal to kNone (the kernels are deterministic).
enum class Recompute : uint8_t { kNone, kSelective, kFull };
Recompute recompute_named(const std::string& name);  // InputError for an unknown name

// What of the model this process holds (pipeline stages, docs/parallelism.md); the
// default is all of it. Parameters keep their global names and blocks their global ids.
struct GptPart {
  std::vector<int64_t> blocks;  // the blocks held, ascending; with all_blocks, ignored
  bool all_blocks = true;
  bool embeddings = true;  // wte and wpe (the first stage)
  bool head = true;        // ln_f and the output projection, tied to wte (the last stage)
};

// Everything one micro-batch's forward saves for its backward.
struct GptCtx {
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

// Bytes one micro-batch of b sequences of t tokens takes in its context's arena (what
// forward keeps and backward adds: GptCtx::arena's peak) through `blocks` blocks, with the
// embeddings and the head when `ends` says, and separately the recompute workspace's
// peak. with_backward = false: forward only (evaluation). docs/parallelism.md, "Memory".
struct ActivationBytes {
  double arena = 0, workspace = 0;
  double staging = 0;  // sequence parallelism's temporaries (nn::Seam::staging)
};
struct GptEnds {
  bool embeddings = true, head = true;
};
// precision kBF16 or kF16 (Gpt::set_precision): the blocks keep 16-bit activations, and the
// workspace holds one block's f32 activations at a time.
ActivationBytes gpt_activation_bytes(const GptConfig& config, int64_t blocks, GptEnds ends, int64_t b, int64_t t,
                                     Recompute recompute, bool with_backward = true, int tp = 1,
                                     bool sequence_parallel = false, DType precision = DType::kF32);

// Key/value memory for incremental decoding in pages (docs/serving.md, "Continuous
// batching"): `total` pages of kPositions positions, each holding every layer's keys and
// values for its positions, in one allocation made up front (the memory budget). A cache
// takes the pages its capacity needs and gives them back when it is destroyed.
// Thread-safety: take and give lock; rows are written by the cache's one decoding thread.
class KvPagePool {
 public:
  static constexpr int64_t kPositions = 16;
  KvPagePool(const GptConfig& config, int64_t pages, DType dtype = DType::kF32);
  static int64_t pages_for(int64_t positions) { return (positions + kPositions - 1) / kPositions; }
  // Bytes of one page (every layer's keys and values for kPositions positions).
  static int64_t page_bytes(const GptConfig& config, DType dtype = DType::kF32);
  int64_t total() const { return total_; }
  int64_t free() const;
  // `n` pages, or none when fewer are free.
  std::optional<std::vector<int32_t>> take(int64_t n);
  void give(const std::vector<int32_t>& pages);
  // The first key (kv 0) or value (kv 1) row of layer `layer` in `page`; rows are C apart.
  std::byte* rows(int32_t page, int64_t layer, int kv) const;
  DType dtype() const { return storage_.dtype(); }
  int64_t n_layer() const { return n_layer_; }
  int64_t row_bytes() const { return c_ * static_cast<int64_t>(dtype_size(storage_.dtype())); }  // one position of one layer's keys

 private:
  int64_t total_, n_layer_, c_;
  Tensor storage_;  // (pages, n_layer, 2, kPositions, C)
  mutable std::mutex mu_;
  std::vector<int32_t> free_;
};

// Keys and values of one sequence's tokens so far, for incremental decoding
// (docs/serving.md): position p's of layer l in page pages[p / kPositions], row p % kPositions.
class KvCache {
 public:
  KvCache() = default;
  // Holds `pages`, taken from pool, for `capacity` positions (Gpt::make_cache takes them).
  KvCache(std::shared_ptr<KvPagePool> pool, std::vector<int32_t> pages, int64_t capacity);
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&& o) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();  // gives the pages back

  int64_t length = 0;  // positions held
  int64_t capacity() const { return capacity_; }
  DType dtype() const { return pool_->dtype(); }  // of its keys and values (the pool's)
  int64_t pages() const { return static_cast<int64_t>(pages_.size()); }
  bool full() const { return length == capacity(); }
  // The first key (kv 0) or value (kv 1) row of layer `layer` in each of this cache's pages.
  template <typename T>
  std::vector<T*> page_rows(int64_t layer, int kv) const {
    std::vector<T*> out;
    page_rows(layer, kv, out);
    return out;
  }
  template <typename T>
  void page_rows(int64_t layer, int kv, std::vector<T*>& out) const {  // into out, reusing its memory
    out.clear();
    for (int32_t p : pages_) out.push_back(reinterpret_cast<T*>(pool_->rows(p, layer, kv)));
  }
  // Positions [0, n) of every layer's keys and values, copied out to (n_layer, 2, n, C)
  // elements of the pool's dtype at `out`; or in, as positions [0, n) of such a copy of
  // `held` positions, after which length is n. A prompt's keys and values computed once are
  // reused by a later prompt that begins the same way (the same bits: each position's keys
  // and values depend on the tokens up to it only).
  // REQUIRES: n <= length (save); n <= capacity() and n <= held (restore).
  void save(int64_t n, std::byte* out) const;
  void restore(int64_t n, const std::byte* in, int64_t held);
  // How many of a sequence's last `tokens` its next decode runs: the prompt's last window
  // first; a full cache starts again (the caller sets length 0) from the last half window,
  // since positions are absolute and cached keys cannot slide; else the one new token.
  int64_t next_rows(int64_t tokens) const {
    if (length == 0) return std::min(tokens, capacity());
    if (full()) return std::min(tokens, std::max<int64_t>(capacity() / 2, 1));
    return 1;
  }

 private:
  std::shared_ptr<KvPagePool> pool_;
  std::vector<int32_t> pages_;
  int64_t capacity_ = 0;
};

class Gpt {
 public:
  // tp: tensor parallelism (attention heads, the MLP and the vocabulary of the tied
  // embedding, head and loss split over tp.parts; wpe and the LayerNorms replicated).
  explicit Gpt(const GptConfig& config, DType dtype = DType::kF32, GptPart part = {}, Shard tp = {});

  // GPT-2 initialisation: weights N(0, 0.02), residual projections (attn.c_proj,
  // mlp.c_proj) N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm weight 1 and bias 0.
  void init(uint64_t seed);

  // tokens, targets: (B, T) i32, T <= seq_len, ids < vocab_size (callers validate at the data
  // edge). Returns the mean next-token cross-entropy.
  double forward(const Tensor& tokens, const Tensor& targets, GptCtx& ctx) const;
  // Logits (B, T, V), or only the last position's (B, 1, V) when last_only. REQUIRES: not
  // tensor-parallel (a piece holds only its columns of the logits).
  Tensor forward_logits(const Tensor& tokens, GptCtx& ctx, bool last_only) const;
  // Accumulates into the gradients d(mean loss x scale)/dparams. REQUIRES: forward(ctx).
  void backward(GptCtx& ctx, double scale) const;

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

  // Pipeline stages run the model in pieces, each over what this part holds; forward and
  // backward above are embed, forward_blocks(0, n_layer), forward_head and back. A piece's
  // ctx is the micro-batch's (one per micro-batch and chunk in flight); begin(ctx) resets
  // its arena before the first forward piece.
  void begin(GptCtx& ctx, int64_t b, int64_t t) const;
  // What embed and each block give and take for b sequences of t tokens: (B, T, C), or under
  // sequence parallelism this piece's rows (B x T / parts, C).
  Shape activation_shape(int64_t b, int64_t t) const;
  // -> (B, T, C); under mixed precision in the workspace, valid until forward_blocks.
  Tensor embed(const Tensor& tokens, GptCtx& ctx) const;
  Tensor forward_blocks(int64_t lo, int64_t hi, const Tensor& x, GptCtx& ctx) const;  // blocks [lo, hi)
  double forward_head(const Tensor& x, const Tensor& targets, GptCtx& ctx) const;     // ln_f, logits, loss
  // defer_weights (zero-bubble pipelines): input gradients and the LayerNorms' now, the
  // linear layers' and the head's weight gradients in backward_weights, the same bits.
  Tensor backward_head(GptCtx& ctx, double scale, bool defer_weights = false) const;  // -> d(x of forward_head)
  Tensor backward_blocks(int64_t lo, int64_t hi, const Tensor& dy, GptCtx& ctx, bool defer_weights = false) const;
  void backward_weights(int64_t lo, int64_t hi, bool head, const GptCtx& ctx) const;
  void backward_embed(const Tensor& dx, GptCtx& ctx) const;

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

  // Called as forward and backward enter and leave each transformer block, in the order
  // loom/params.h's BlockPhase describes; block -1 is wte, wpe, ln_f and the tied head.
  BlockHook on_block;

  // n_layer + 1 flat element offsets: block b's parameters are [offsets[b], offsets[b+1]).
  std::vector<int64_t> block_offsets() const;

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
  bool holds_block(int64_t block) const;
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  // Forward FLOPs per token: 2 x matmul parameters (tied head counted, wpe not) plus
  // attention 4 x n_layer x d_model x T; training costs 3x this.
  double forward_flops_per_token(int64_t t) const;

 private:
  Tensor trunk(const Tensor& tokens, GptCtx& ctx) const;  // embeddings + blocks + ln_f
  // forward_blocks and backward_blocks under mixed precision.
  Tensor forward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& x, GptCtx& ctx) const;
  Tensor backward_blocks_mixed(int64_t lo, int64_t hi, const Tensor& dy, GptCtx& ctx) const;
  Tensor head_weight() const;  // wte, or under mixed precision its rounded copy in the workspace
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
