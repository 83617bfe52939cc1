#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace loom::app {

Sampler::Sampler(int64_t vocab) : vocab_(vocab), probs_(static_cast<size_t>(vocab)), order_(static_cast<size_t>(vocab)) {}

int32_t Sampler::pick(const float* logits, const SamplingParams& p, Rng& rng) {
  if (p.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits);
  for (int32_t i = 0; i < vocab_; ++i) order_[i] = i;
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab_) : vocab_;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double mx = logits[order_[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += (probs_[i] = static_cast<float>(std::exp((logits[order_[i]] - mx) / p.temperature)));
  int64_t keep = k;
  if (p.top_p < 1) {  // the likeliest first: the shortest prefix holding top_p of the mass
    double mass = 0;
    for (int64_t i = 0; i < k; ++i)
      if ((mass += probs_[i]) >= p.top_p * sum) {
        keep = i + 1;
        sum = mass;
        break;
      }
  }
  double r = rng.uniform() * sum;
  for (int64_t i = 0; i < keep; ++i)
    if ((r -= probs_[i]) < 0) return order_[i];
  return order_[keep - 1];
}

}  // namespace loom::app
