// Prompts' keys and values kept for reuse by `loom serve` (docs/serving.md, "Prefix
// cache"): a request whose prompt begins as a kept prompt does gets those positions' keys
// and values copied into its own cache and computes only the rest of its prompt. A system
// prompt or few-shot examples shared by many requests are then computed once. The tokens
// made are the same bits either way: a position's keys and values depend only on the
// tokens up to it, and each row is computed alone (docs/numerics.md).
// Thread-safety: every method from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <vector>

#include "loom/nn/gpt.h"

namespace loom::serve {

class PrefixCache {
 public:
  // budget_bytes: the kept keys and values together; least recently used prompts go first.
  // position_bytes: one position's keys and values in every layer.
  PrefixCache(int64_t budget_bytes, int64_t position_bytes);
  // Restores into `cache` (empty) the longest run of prompt[0, limit) that a kept prompt
  // begins with, and returns its length (0: no kept prompt begins with prompt[0]).
  int64_t restore(std::span<const int32_t> prompt, int64_t limit, nn::KvCache& cache);
  // Keeps the keys and values of `prompt` from `cache`, which holds its positions, unless a
  // kept prompt already begins with it or it alone is over the budget.
  void keep(std::span<const int32_t> prompt, const nn::KvCache& cache);

  int64_t hits() const;            // restores of at least one position
  int64_t reused_tokens() const;   // positions restored, all told
  int64_t bytes() const;           // kept now

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::vector<std::byte> kv;  // (n_layer, 2, tokens, C)
  };
  const int64_t budget_, position_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  int64_t bytes_ = 0, hits_ = 0, reused_ = 0;
};

}  // namespace loom::serve
