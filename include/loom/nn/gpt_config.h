// A GPT's shape and what follows from it before one is built: its parameter counts, what
// a process holds of it (a pipeline stage's part), the activation memory of a micro-batch
// (the memory plan's figures), and the recompute modes. loom/nn/gpt.h builds the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/dtype.h"

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

}  // namespace loom::nn
