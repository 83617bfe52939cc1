// For the decoding tests: sequences decoded step by step (step 0 a prefill of prefill[s]
// tokens from row s of `tokens`, then one token a step), each alone with a whole-window
// cache of its own (or the one `alone` gives, when given), and all together through
// decode_batch and decode_grouped with the caches `make` gives (each pass its own, given
// back before the next).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "loom/nn/gpt.h"

namespace loom::nn::decoding {

struct DecodeRuns {
  std::vector<std::vector<float>> alone, together, grouped;  // per sequence, every step's logits
};

inline DecodeRuns decode_alone_and_together(const Gpt& gpt, const Tensor& tokens, std::span<const int64_t> prefill,
                                            int64_t steps, const std::function<KvCache(int64_t)>& make,
                                            const std::function<KvCache(int64_t)>& alone = {}) {
  const GptConfig& g = gpt.config();
  const auto seqs = static_cast<int64_t>(prefill.size());
  auto rows = [&](int64_t s, int64_t step) {
    const int64_t from = step == 0 ? 0 : prefill[s] + step - 1, n = step == 0 ? prefill[s] : 1;
    return std::span<const int32_t>(tokens.data<int32_t>() + s * tokens.dim(1) + from, static_cast<size_t>(n));
  };
  DecodeRuns r{std::vector<std::vector<float>>(seqs), std::vector<std::vector<float>>(seqs),
               std::vector<std::vector<float>>(seqs)};
  Arena arena;
  for (int64_t s = 0; s < seqs; ++s) {
    KvCache cache = alone ? alone(s) : gpt.make_cache();
    for (int64_t step = 0; step < steps; ++step) {
      const Tensor l = gpt.decode(rows(s, step), cache, arena);
      r.alone[s].insert(r.alone[s].end(), l.data<float>(), l.data<float>() + g.vocab_size);
    }
  }
  // Batched: once through decode_batch, once through decode_grouped with two arenas (two
  // groups from six sequences on).
  auto batched = [&](std::vector<std::vector<float>>& out, bool grouped) {
    std::vector<KvCache> caches;
    for (int64_t s = 0; s < seqs; ++s) caches.push_back(make(s));
    std::vector<Arena> groups(2);
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<std::span<const int32_t>> batch;
      std::vector<KvCache*> ptrs;
      for (int64_t s = 0; s < seqs; ++s) {
        batch.push_back(rows(s, step));
        ptrs.push_back(&caches[s]);
      }
      // Grouped: each group's logits as its thread hands them over (the gathered ones are
      // copies of these).
      auto take = [&](int64_t first, const Tensor& l) {
        for (int64_t i = 0; i < l.dim(0); ++i)
          out[first + i].insert(out[first + i].end(), l.data<float>() + i * g.vocab_size,
                                l.data<float>() + (i + 1) * g.vocab_size);
      };
      if (grouped)
        gpt.decode_grouped(batch, ptrs, groups, arena, take);
      else
        take(0, gpt.decode_batch(batch, ptrs, arena));
    }
  };
  batched(r.together, false);
  batched(r.grouped, true);
  return r;
}

}  // namespace loom::nn::decoding
