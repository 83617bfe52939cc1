// Magnitude pruning of a GPT's linear layers in its blocks (docs/serving.md, "Pruning"):
// what `loom prune` does before it writes the checkpoint, whose zeros a fine-tuning run
// keeps (`loom train --init-from OUT --training.keep_zeros=true`). The tied embedding and
// the LayerNorms are not pruned.
// Thread-safety: reentrant (the GPT is the caller's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/nn/gpt.h"

namespace loom::serve {

enum class Structure {
  kNone,   // each weight matrix's smallest |w|
  kRows,   // each layer's output channels (a column of (in, out) and its bias) of smallest L2 norm
  kHeads,  // each attention layer's heads of smallest L2 norm (q, k, v columns and biases; out rows)
};
// --structured's value: none, rows or heads; InputError for any other.
Structure structure_named(const std::string& name);

struct Pruned {
  int64_t removed = 0;  // weights this pruning set to zero
  int64_t total = 0;    // weights of the linear layers
  int64_t zeros = 0;    // of those, zero now (removed, and any that were zero before)
};
// Removes `sparsity` of each layer's weights (or rows, or heads) by magnitude, in place.
// REQUIRES: 0 <= sparsity < 1.
Pruned prune_gpt(nn::Gpt& gpt, double sparsity, Structure structure);

// [training] keep_zeros (docs/serving.md, "Pruning"): which elements of this rank's
// weights and biases (ParamKind kWeight, kBias) are exactly zero, one byte each; and
// zeroing them again after an update.
std::vector<uint8_t> zero_mask(const ParamSet& params);
void apply_zero_mask(const ParamSet& params, const std::vector<uint8_t>& mask);

}  // namespace loom::serve
