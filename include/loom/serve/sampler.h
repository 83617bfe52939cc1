// Picking the next token from a model's logits, for `loom sample` and `loom serve`
// (docs/serving.md): temperature, top-k and top-p (nucleus), one draw from a seeded Rng.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/rng.h"

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

}  // namespace loom::serve
