#include "loom/serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/fast_math.h"

namespace loom::serve {
namespace {

// A token's weight e^((logit - max) / temperature), by the kernels' exp (vectorizable, the
// same bits on every CPU; libm's double exp, one call per token, was 2% of a 16-client int8
// server's time with gpt-mini's 256 tokens).
inline float token_weight(float logit, float mx, float inv_t) { return kernels::fast_exp((logit - mx) * inv_t); }

}  // namespace

Sampler::Sampler(int64_t vocab) : vocab_(vocab), probs_(static_cast<size_t>(vocab)), order_(static_cast<size_t>(vocab)) {}

int32_t Sampler::pick(const float* logits, const SamplingParams& p, Rng& rng) {
  if (p.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits);
  const float mx = *std::max_element(logits, logits + vocab_), inv_t = static_cast<float>(1 / p.temperature);
  if (p.top_k == 0 && p.top_p >= 1) {
    // Every token may be drawn: no order is needed (sorting a vocabulary was most of the
    // time of a step's sampling), the ids are walked in turn.
    float* probs = probs_.data();
#pragma omp simd
    for (int64_t id = 0; id < vocab_; ++id) probs[id] = token_weight(logits[id], mx, inv_t);
    double sum = 0;
    for (int64_t id = 0; id < vocab_; ++id) sum += probs[id];
    double r = rng.uniform() * sum;
    int32_t last = 0;
    for (int32_t id = 0; id < vocab_; ++id) {
      if (probs_[id] == 0) continue;
      if ((r -= probs_[id]) < 0) return id;
      last = id;
    }
    return last;  // rounding left a little of r
  }
  // The likeliest first, equal logits by id: one order on every machine.
  const auto likelier = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::iota(order_.begin(), order_.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab_) : vocab_;
  if (k < vocab_) std::nth_element(order_.begin(), order_.begin() + k - 1, order_.end(), likelier);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += probs_[order_[i]] = token_weight(logits[order_[i]], mx, inv_t);
  // The shortest likeliest prefix of the k holding top_p of their mass (all k when top_p is
  // 1), put in order a few at a time: the nucleus is usually far smaller than the vocabulary.
  int64_t keep = 0;
  double mass = 0;
  for (int64_t sorted = 0, next = std::min<int64_t>(k, 64); keep == 0; sorted = next, next = std::min(k, 4 * next)) {
    const auto first = order_.begin() + sorted, last = order_.begin() + next;
    if (next < k) std::nth_element(first, last - 1, order_.begin() + k, likelier);
    std::sort(first, last, likelier);
    for (int64_t i = sorted; i < next && keep == 0; ++i)
      if (((mass += probs_[order_[i]]) >= p.top_p * sum && p.top_p < 1) || i == k - 1) keep = i + 1;
  }
  double r = rng.uniform() * mass;
  for (int64_t i = 0; i < keep; ++i)
    if ((r -= probs_[order_[i]]) < 0) return order_[i];
  return order_[keep - 1];
}

void generate(const nn::Gpt& gpt, std::vector<int32_t>& seq, int64_t tokens, int64_t lines,
              std::span<const uint8_t> newlines_in, const SamplingParams& params, Rng& rng, bool kv_cache) {
  const int64_t vocab = gpt.config().vocab_size, window = gpt.config().seq_len;
  nn::GptCtx ctx;
  nn::KvCache cache = gpt.make_cache();
  Arena arena;
  auto next_logits = [&]() -> const float* {
    const auto context = [&](int64_t n) { return std::span<const int32_t>(seq).last(static_cast<size_t>(n)); };
    if (!kv_cache) {
      const auto n = static_cast<int64_t>(std::min<size_t>(seq.size(), static_cast<size_t>(window)));
      Tensor x = Tensor::zeros({1, n}, DType::kI32);
      std::ranges::copy(context(n), x.data<int32_t>());
      return gpt.forward_logits(x, ctx, /*last_only=*/true).data<float>();
    }
    const int64_t n = cache.next_rows(static_cast<int64_t>(seq.size()));
    if (cache.full()) cache.length = 0;
    return gpt.decode(context(n), cache, arena).data<float>();
  };
  Sampler sampler(vocab);
  int64_t seen = 0;
  for (int64_t n = 0; n < tokens; ++n) {
    seq.push_back(sampler.pick(next_logits(), params, rng));
    if (lines > 0 && static_cast<size_t>(seq.back()) < newlines_in.size() && (seen += newlines_in[seq.back()]) >= lines)
      break;
  }
}

}  // namespace loom::serve
