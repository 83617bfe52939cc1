// A GPT on f32 weights in panels (Gpt::use_panels): the bits of the same model without them,
// forward and decoding, alone or in a batch, with the weights' memory accounted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "loom/nn/gpt.h"
#include "loom/core/threads.h"
#include "loom_testing.h"
#include "nn/decode_testing.h"

namespace loom::nn {
namespace {

// vocab 40: the head's last sliver is partial; d_model 48: so is every product's k.
const GptConfig kConfig{.n_layer = 2, .n_head = 2, .d_model = 48, .seq_len = 16, .vocab_size = 40};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(GptPanels, ForwardGivesTheBitsOfTheModelWithoutPanels) {
  Gpt plain(kConfig), panels(kConfig);
  plain.init(3);
  panels.init(3);
  panels.use_panels();
  EXPECT_TRUE(panels.panels());
  EXPECT_FALSE(plain.panels());
  // The embedding reads its rows from the head's panels: what stays of wte is never read.
  const Tensor table = panels.params().value(panels.params().find("transformer.wte.weight"));
  std::fill(table.data<float>(), table.data<float>() + table.numel(), std::numeric_limits<float>::quiet_NaN());
  // 7 rows a sequence: the few-row tiles; 2 x 16: the row tiles past them.
  for (int64_t t : {7, 16}) {
    const Tensor tokens = testing::random_tokens(2, t, kConfig.vocab_size, 4).first;
    GptCtx a, b;
    EXPECT_TRUE(same_bits(plain.forward_logits(tokens, a, false), panels.forward_logits(tokens, b, false))) << "T " << t;
  }
  // The linear weights' panels replace them (k x out, out a multiple of 32 here, but for
  // 48 x 144 and 48 x 48: 160 and 64 columns), and the head's (48 x 40 -> 64) replace wte,
  // whose rows the embedding reads from them.
  int64_t want = plain.weight_bytes();
  for (int64_t l = 0; l < 2; ++l) want += 4 * 48 * ((160 - 144) + (64 - 48) + (192 - 192) + (64 - 48) * 4);
  want += 4 * 48 * (64 - 40);
  EXPECT_EQ(panels.weight_bytes(), want);
}

TEST(GptPanels, DecodingAloneAndInABatchGivesTheBitsWithoutPanels) {
  const int threads = compute_threads();
  set_compute_threads(2);
  Gpt plain(kConfig), panels(kConfig);
  plain.init(6);
  panels.init(6);
  panels.use_panels();
  const Tensor tokens = testing::random_tokens(6, kConfig.seq_len, kConfig.vocab_size, 10).first;
  const int64_t prefill[] = {3, 5, 2, 7, 1, 4};
  const auto caches = [](const Gpt& g) { return [&g](int64_t) { return g.make_cache(); }; };
  const decoding::DecodeRuns want = decoding::decode_alone_and_together(plain, tokens, prefill, 6, caches(plain));
  const decoding::DecodeRuns got = decoding::decode_alone_and_together(panels, tokens, prefill, 6, caches(panels));
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(got.alone[s], want.alone[s]) << "sequence " << s;
    EXPECT_EQ(got.together[s], want.alone[s]) << "sequence " << s << ", in a batch";
    EXPECT_EQ(got.grouped[s], want.alone[s]) << "sequence " << s << ", grouped";
  }
  set_compute_threads(threads);
}

}  // namespace
}  // namespace loom::nn
