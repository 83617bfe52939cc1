// Paged key/value caches (loom/nn/gpt.h, KvPagePool): a cache takes the pages its capacity
// needs and gives them back; sequences decoding from one shared pool, their pages
// interleaved, get the bits each gets from a whole-window cache of its own; positions saved
// from one cache and restored into another give the bits of computing them there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "loom/nn/gpt.h"
#include "nn/decode_testing.h"
#include "loom_testing.h"

namespace loom::nn {
namespace {

const GptConfig kConfig{.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 48, .vocab_size = 30};

TEST(KvCache, TakesThePagesItsCapacityNeedsAndGivesThemBack) {
  Gpt gpt(kConfig);
  auto pool = std::make_shared<KvPagePool>(kConfig, 5);
  EXPECT_EQ(KvPagePool::pages_for(1), 1);
  EXPECT_EQ(KvPagePool::pages_for(16), 1);
  EXPECT_EQ(KvPagePool::pages_for(17), 2);
  std::optional<KvCache> a = gpt.make_cache(pool, 20), b = gpt.make_cache(pool, 48);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->pages(), 2);
  EXPECT_EQ(b->pages(), 3);
  EXPECT_EQ(pool->free(), 0);
  EXPECT_FALSE(gpt.make_cache(pool, 1).has_value()) << "an empty pool refuses";
  a.reset();
  EXPECT_EQ(pool->free(), 2);
  KvCache moved = std::move(*b);
  b.reset();  // the moved-from cache holds nothing
  EXPECT_EQ(pool->free(), 2);
  moved = KvCache();  // giving a cache a new value gives its pages back
  EXPECT_EQ(pool->free(), 5);
  EXPECT_EQ(KvPagePool::page_bytes(kConfig), 2 * 2 * 16 * 32 * 4);
}

TEST(KvCache, SequencesSharingAPoolGetTheBitsOfAWholeWindowEach) {
  Gpt gpt(kConfig);
  gpt.init(3);
  const Tensor tokens = testing::random_tokens(6, kConfig.seq_len, kConfig.vocab_size, 5).first;
  const int64_t prefill[] = {3, 18, 7, 1, 5, 2}, capacity[] = {20, 40, 33, 13, 17, 14};  // 12 pages
  auto pool = std::make_shared<KvPagePool>(kConfig, 14);
  const decoding::DecodeRuns r = decoding::decode_alone_and_together(
      gpt, tokens, prefill, 12, [&](int64_t s) { return std::move(*gpt.make_cache(pool, capacity[s])); });
  EXPECT_EQ(pool->free(), 14) << "every page given back";
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(r.together[s], r.alone[s]) << "sequence " << s;
    EXPECT_EQ(r.grouped[s], r.alone[s]) << "sequence " << s << ", grouped";
  }
}

// Keys and values kept in bf16 (loom serve --kv-cache-dtype bf16): each sequence gets the
// same bits alone or in a batch, and logits close to those of f32 caches.
TEST(KvCache, Bf16KeysAndValuesGiveTheSameBitsAloneOrTogetherCloseToF32s) {
  Gpt gpt(kConfig);
  gpt.init(3);
  const Tensor tokens = testing::random_tokens(6, kConfig.seq_len, kConfig.vocab_size, 5).first;
  const int64_t prefill[] = {3, 18, 7, 1, 5, 2};
  auto pool = std::make_shared<KvPagePool>(kConfig, 18, DType::kBF16);
  EXPECT_EQ(KvPagePool::page_bytes(kConfig, DType::kBF16), 2 * 2 * 16 * 32 * 2);
  const auto bf16 = [&](int64_t) { return std::move(*gpt.make_cache(pool, kConfig.seq_len)); };
  const decoding::DecodeRuns half = decoding::decode_alone_and_together(gpt, tokens, prefill, 12, bf16, bf16);
  const decoding::DecodeRuns f32 = decoding::decode_alone_and_together(gpt, tokens, prefill, 12, bf16);  // .alone: f32
  EXPECT_EQ(pool->free(), 18) << "every page given back";
  double worst = 0, largest = 0;
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(half.together[s], half.alone[s]) << "sequence " << s;
    EXPECT_EQ(half.grouped[s], half.alone[s]) << "sequence " << s << ", grouped";
    EXPECT_NE(half.alone[s], f32.alone[s]) << "sequence " << s << ": bf16 caches, not f32 ones";
    for (size_t i = 0; i < half.alone[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(half.alone[s][i] - f32.alone[s][i])));
      largest = std::max(largest, static_cast<double>(std::fabs(f32.alone[s][i])));
    }
  }
  EXPECT_LT(worst, 2e-3 * largest) << "largest |logit| " << largest;  // 3.6e-4 here
}

TEST(KvCache, RestoredPositionsGiveTheBitsOfThePrefillThatMadeThem) {
  Gpt gpt(kConfig);
  gpt.init(3);
  const Tensor tokens = testing::random_tokens(1, 40, kConfig.vocab_size, 9).first;
  const std::span<const int32_t> all(tokens.data<int32_t>(), 40);
  auto pool = std::make_shared<KvPagePool>(kConfig, 12);
  Arena arena;
  // A prompt of 21 tokens prefilled, its positions saved.
  KvCache kept = *gpt.make_cache(pool, 48);
  gpt.decode(all.first(21), kept, arena);
  const int64_t position = 2 * 2 * 32 * 4;
  std::vector<std::byte> saved(21 * position);
  kept.save(21, saved.data());
  // A prompt that shares its first 17 tokens: restored, then the rest read, against the whole
  // prompt read into a cache of its own; then decoding on from both.
  for (int64_t shared : {17, 21, 1}) {
    std::vector<int32_t> prompt(all.begin(), all.begin() + 30);
    KvCache whole = *gpt.make_cache(pool, 48), reused = *gpt.make_cache(pool, 48);
    reused.restore(shared, saved.data(), 21);
    EXPECT_EQ(reused.length, shared);
    for (int64_t step = 0; step < 4; ++step) {
      const std::span<const int32_t> p(prompt);
      const Tensor a = gpt.decode(step == 0 ? p : p.last(1), whole, arena);
      const std::vector<float> want(a.data<float>(), a.data<float>() + kConfig.vocab_size);
      const Tensor b = gpt.decode(step == 0 ? p.subspan(static_cast<size_t>(shared)) : p.last(1), reused, arena);
      EXPECT_EQ(std::memcmp(b.data<float>(), want.data(), want.size() * sizeof(float)), 0)
          << shared << " shared, step " << step;
      prompt.push_back(all[static_cast<size_t>(30 + step)]);
    }
  }
}

}  // namespace
}  // namespace loom::nn
