// A GPT on INT8 weights (Gpt::use_int8): close to its f32 self, a quarter of the weight
// bytes, and decoding in a batch gives each sequence the bits it gets alone.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "loom/nn/gpt.h"
#include "loom/threads.h"
#include "loom_testing.h"

namespace loom::nn {
namespace {

const GptConfig kConfig{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 16, .vocab_size = 40};

TEST(GptInt8, LogitsStayCloseToFloatAndWeightsTakeAQuarter) {
  Gpt f32(kConfig), q(kConfig);
  f32.init(3);
  q.init(3);
  q.use_int8(q.quantize_int8());
  const Tensor tokens = testing::random_tokens(2, kConfig.seq_len, kConfig.vocab_size, 4).first;
  GptCtx a, b;
  const Tensor want = f32.forward_logits(tokens, a, false), got = q.forward_logits(tokens, b, false);
  double err = 0, size = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got.data<float>()[i] - want.data<float>()[i];
    err += d * d;
    size += static_cast<double>(want.data<float>()[i]) * want.data<float>()[i];
  }
  EXPECT_LT(std::sqrt(err / size), 0.05);
  EXPECT_GT(err, 0.0);
  // The linear weights and wte at 1 byte + a 4-byte scale per channel; the rest f32.
  int64_t f32_bytes = f32.params().numel() * 4, int8_bytes = 0, rest = f32_bytes;
  for (const std::string& name : q.int8_weight_names()) {
    const ParamInfo& p = q.params().infos()[q.params().find(name)];
    rest -= 4 * p.numel;
    int8_bytes += p.numel + 4 * (name.find(".wte.") != std::string::npos || name.find(".wpe.") != std::string::npos
                                     ? p.shape[0] : p.shape[1]);
  }
  EXPECT_EQ(q.weight_bytes(), int8_bytes + rest);
  EXPECT_EQ(f32.weight_bytes(), f32_bytes);
  EXPECT_LT(q.weight_bytes(), f32_bytes / 3);
}

TEST(GptInt8, DecodingABatchGivesEachSequenceTheBitsItGetsAlone) {
  const int threads = compute_threads();
  set_compute_threads(2);
  Gpt gpt(kConfig);
  gpt.init(6);
  gpt.use_int8(gpt.quantize_int8());
  const Tensor tokens = testing::random_tokens(3, kConfig.seq_len, kConfig.vocab_size, 10).first;
  auto seq = [&](int64_t s, int64_t from, int64_t n) {
    return std::span<const int32_t>(tokens.data<int32_t>() + s * kConfig.seq_len + from, static_cast<size_t>(n));
  };
  const int64_t prefill[] = {3, 5, 2}, steps = 6;
  Arena arena;
  std::vector<std::vector<float>> alone(3), together(3);
  for (int64_t s = 0; s < 3; ++s) {
    KvCache cache = gpt.make_cache();
    for (int64_t step = 0; step < steps; ++step) {
      const Tensor l = gpt.decode(step == 0 ? seq(s, 0, prefill[s]) : seq(s, prefill[s] + step - 1, 1), cache, arena);
      alone[s].insert(alone[s].end(), l.data<float>(), l.data<float>() + kConfig.vocab_size);
    }
  }
  std::vector<KvCache> caches(3);
  for (auto& c : caches) c = gpt.make_cache();
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::span<const int32_t>> batch;
    std::vector<KvCache*> ptrs;
    for (int64_t s = 0; s < 3; ++s) {
      batch.push_back(step == 0 ? seq(s, 0, prefill[s]) : seq(s, prefill[s] + step - 1, 1));
      ptrs.push_back(&caches[s]);
    }
    const Tensor l = gpt.decode_batch(batch, ptrs, arena);
    for (int64_t s = 0; s < 3; ++s)
      together[s].insert(together[s].end(), l.data<float>() + s * kConfig.vocab_size,
                         l.data<float>() + (s + 1) * kConfig.vocab_size);
  }
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
  set_compute_threads(threads);
}

}  // namespace
}  // namespace loom::nn
