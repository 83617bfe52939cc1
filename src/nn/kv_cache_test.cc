// Paged key/value caches (loom/nn/gpt.h, KvPagePool): a cache takes the pages its capacity
// needs and gives them back; sequences decoding from one shared pool, their pages
// interleaved, get the bits each gets from a whole-window cache of its own.
#include <gtest/gtest.h>

#include <vector>

#include "loom/nn/gpt.h"
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
  const Tensor tokens = testing::random_tokens(3, kConfig.seq_len, kConfig.vocab_size, 5).first;
  auto seq = [&](int64_t s, int64_t from, int64_t n) {
    return std::span<const int32_t>(tokens.data<int32_t>() + s * kConfig.seq_len + from, static_cast<size_t>(n));
  };
  const int64_t prefill[] = {3, 18, 7}, capacity[] = {20, 40, 33}, steps = 12;
  Arena arena;
  std::vector<std::vector<float>> alone(3), shared(3);
  for (int64_t s = 0; s < 3; ++s) {
    KvCache cache = gpt.make_cache();
    for (int64_t step = 0; step < steps; ++step) {
      const Tensor l = gpt.decode(step == 0 ? seq(s, 0, prefill[s]) : seq(s, prefill[s] + step - 1, 1), cache, arena);
      alone[s].insert(alone[s].end(), l.data<float>(), l.data<float>() + kConfig.vocab_size);
    }
  }
  auto pool = std::make_shared<KvPagePool>(kConfig, 10);
  std::vector<KvCache> caches;
  for (int64_t s = 0; s < 3; ++s) caches.push_back(std::move(*gpt.make_cache(pool, capacity[s])));
  EXPECT_EQ(pool->free(), 10 - 2 - 3 - 3);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::span<const int32_t>> batch;
    std::vector<KvCache*> ptrs;
    for (int64_t s = 0; s < 3; ++s) {
      batch.push_back(step == 0 ? seq(s, 0, prefill[s]) : seq(s, prefill[s] + step - 1, 1));
      ptrs.push_back(&caches[s]);
    }
    const Tensor l = gpt.decode_batch(batch, ptrs, arena);
    for (int64_t s = 0; s < 3; ++s)
      shared[s].insert(shared[s].end(), l.data<float>() + s * kConfig.vocab_size, l.data<float>() + (s + 1) * kConfig.vocab_size);
  }
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(shared[s], alone[s]) << "sequence " << s;
}

}  // namespace
}  // namespace loom::nn
