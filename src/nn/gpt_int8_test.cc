// A GPT on INT8 weights (Gpt::use_int8): close to its f32 self, a quarter of the weight
// bytes, and decoding in a batch gives each sequence the bits it gets alone.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "loom/nn/gpt.h"
#include "nn/decode_testing.h"
#include "loom/core/threads.h"
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
  const Tensor tokens = testing::random_tokens(6, kConfig.seq_len, kConfig.vocab_size, 10).first;
  const int64_t prefill[] = {3, 5, 2, 7, 1, 4};  // grouped: two groups of three
  const decoding::DecodeRuns r =
      decoding::decode_alone_and_together(gpt, tokens, prefill, 6, [&](int64_t) { return gpt.make_cache(); });
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(r.together[s], r.alone[s]) << "sequence " << s;
    EXPECT_EQ(r.grouped[s], r.alone[s]) << "sequence " << s << ", grouped";
  }
  set_compute_threads(threads);
}

}  // namespace
}  // namespace loom::nn
