// Picking the next token from a model's logits, for `loom sample` and `loom serve`
// (docs/serving.md): temperature, top-k and top-p (nucleus), one draw from a seeded Rng.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/rng.h"
#include "loom/nn/gpt.h"

namespace loom::serve {

struct SamplingParams {
  double temperature = 1.0;  // 0: the likeliest token (the first of equals), no draw
  int64_t top_k = 0;         // only the k likeliest (0: all)
  double top_p = 1.0;        // then the fewest likeliest whose probability reaches top_p
};

// Reusable buffers for one vocabulary size; one per thread.
class Sampler {
 public:
  explicit Sampler(int64_t vocab);
  // REQUIRES: temperature >= 0, top_k >= 0, 0 < top_p <= 1; logits: vocab finite values.
  int32_t pick(const float* logits, const SamplingParams& p, Rng& rng);

 private:
  int64_t vocab_;
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

// `loom sample`'s generation: up to `tokens` tokens after `seq` (the prompt, extended in
// place), each drawn by `params` from the next position's logits; it stops after `lines`
// newlines when lines > 0, counting newlines_in[id] for each token drawn (a tokenizer's:
// none when empty). With the key/value cache
// each token is one position's forward; when the window is full the cache starts again from
// the last half window (absolute positions: the cached keys cannot slide), so every token
// sees between seq_len / 2 and seq_len tokens before it. Without it (kv_cache false) the
// whole window runs again for each token: the reference the cache is tested against.
void generate(const nn::Gpt& gpt, std::vector<int32_t>& seq, int64_t tokens, int64_t lines,
              std::span<const uint8_t> newlines_in, const SamplingParams& params, Rng& rng, bool kv_cache);

}  // namespace loom::serve
