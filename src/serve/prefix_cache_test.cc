// The prefix cache (prefix_cache.h) in the batcher: requests whose prompts begin as a kept
// prompt does reuse its keys and values, compute only the rest, and make the same tokens,
// bit for bit, as a batcher that keeps none; the budget holds; a mismatch reuses nothing.
#include "loom/serve/prefix_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/serve/batcher.h"

namespace loom::serve {
namespace {

nn::GptConfig tiny() { return {.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 64, .vocab_size = 256}; }

std::vector<int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Each prompt's completion, one request after another (so each can find the ones before).
std::vector<std::string> complete(Batcher& b, const std::vector<std::string>& prompts) {
  std::vector<std::string> out;
  for (const std::string& p : prompts) {
    GenerationRequest r{.prompt = bytes(p), .max_tokens = 12, .seed = 5};
    r.sampling.temperature = 0.9;
    const std::shared_ptr<Generation> g = b.submit(std::move(r));
    std::string text;
    for (Generation::Event e; !(e = g->next()).done;) text += e.piece;
    out.push_back(text);
  }
  return out;
}

TEST(PrefixCache, PromptsThatBeginAsAKeptOneReuseItsKeysAndValuesAndMakeTheSameTokens) {
  nn::Gpt gpt(tiny());
  gpt.init(3);
  const std::vector<std::string> prompts = {
      "You are terse. Q: one",   // kept
      "You are terse. Q: one",   // the same: all but its last token reused
      "You are terse. Q: two",   // begins as the first does: 18 tokens reused
      "Something else",          // no kept prompt begins with 'S'
      "You are terse. Q: one, and more",  // the first prompt whole, then more
  };
  Batcher plain(gpt, {.prefix_cache_bytes = 0}, nullptr);
  const std::vector<std::string> want = complete(plain, prompts);
  EXPECT_EQ(plain.prefix_cache(), nullptr);

  Batcher kept(gpt, {.prefix_cache_bytes = 1 << 20}, nullptr);
  EXPECT_EQ(complete(kept, prompts), want) << "reused keys and values are the bits a prefill computes";
  const PrefixCache& cache = *kept.prefix_cache();
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.reused_tokens(), 20 + 18 + 21);
  // Kept: prompts 0, 2, 3 and 4; the second is the first again. One position is 2 layers'
  // keys and values of 32 floats.
  EXPECT_EQ(cache.bytes(), (21 + 21 + 14 + 31) * 2 * 2 * 32 * 4);
}

TEST(PrefixCache, KeepsWithinItsBudgetLeastRecentlyUsedFirst) {
  nn::Gpt gpt(tiny());
  gpt.init(3);
  const int64_t position = 2 * 2 * 32 * 4;
  // Room for 40 positions: the 21-token prompts "A..." and "B..." do not both fit.
  Batcher b(gpt, {.prefix_cache_bytes = 40 * position}, nullptr);
  const std::string a = "AAAA you are terse: one", c = "BBBB you are terse: one";
  complete(b, {a, c});
  EXPECT_EQ(b.prefix_cache()->bytes(), static_cast<int64_t>(c.size()) * position) << "a was evicted for c";
  complete(b, {a});
  EXPECT_EQ(b.prefix_cache()->hits(), 0) << "a was no longer kept";
  complete(b, {std::string(41, 'x')});  // over the budget alone: not kept, nothing evicted
  EXPECT_EQ(b.prefix_cache()->bytes(), static_cast<int64_t>(a.size()) * position);
}

}  // namespace
}  // namespace loom::serve
