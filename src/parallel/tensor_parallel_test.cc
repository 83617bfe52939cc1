// Tensor parallelism equals serial: a GPT whose heads, MLP and vocabulary (the tied embedding,
// the head and the loss) are split over 2 or 4 ranks
// (threads) starts from the pieces of the serial model's weights, bit for bit, and computes
// the serial loss and the pieces of the serial gradients to rounding: the split matrix
// products and the parts' sums add in another order (docs/parallelism.md states the
// tolerance and why).
#include <gtest/gtest.h>

#include <cmath>

#include "../comm/comm_testing.h"
#include "loom/nn/gpt.h"
#include "loom/core/rng.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/core/threads.h"
#include "loom_testing.h"

namespace loom::parallel {
namespace {

const nn::GptConfig kModel{.n_layer = 2, .n_head = 4, .d_model = 64, .seq_len = 16, .vocab_size = 64};

struct Result {
  double loss = 0;
  int64_t logit_columns = 0;  // of the logits this rank held
  std::map<std::string, std::vector<double>> values, grads;  // each parameter's piece
};

template <typename T>
Result run(nn::Gpt& gpt) {
  auto [tokens, targets] = loom::testing::random_tokens(2, kModel.seq_len, kModel.vocab_size, 3);
  nn::GptCtx ctx;
  Result out;
  out.loss = gpt.forward(tokens, targets, ctx);
  out.logit_columns = ctx.logits.dim(-1);
  gpt.backward(ctx, 1.0);
  for (size_t i = 0; i < gpt.params().infos().size(); ++i) {
    Tensor v = gpt.params().value(static_cast<int>(i)), g = gpt.params().grad(static_cast<int>(i));
    const std::string& name = gpt.params().infos()[i].name;
    out.values[name].assign(v.data<T>(), v.data<T>() + v.numel());
    out.grads[name].assign(g.data<T>(), g.data<T>() + g.numel());
  }
  return out;
}

// The serial model's piece of each parameter, as rank `index` of `parts` holds it.
template <typename T>
std::vector<double> piece(const ParamInfo& p, const std::vector<double>& whole) {
  std::vector<T> w(whole.begin(), whole.end()), mine(static_cast<size_t>(p.numel));
  take_piece(p, w.data(), mine.data());
  return {mine.begin(), mine.end()};
}

template <typename T>
void expect_tensor_parallel_equals_serial(int parts, double tolerance, bool sequence = false,
                                          nn::Recompute recompute = nn::Recompute::kNone) {
  set_compute_threads(1);
  const DType dtype = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  nn::Gpt serial_model(kModel, dtype);
  serial_model.init(11);
  const Result serial = run<T>(serial_model);
  comm::testing::run_ranks(parts, {}, [&](comm::Communicator& tp) {
    TensorParallelSeam seam(tp);
    nn::Shard shard = seam.shard();
    shard.sequence = sequence;
    nn::Gpt gpt(kModel, dtype, {}, shard);
    gpt.init(11);
    gpt.set_recompute(recompute);
    const Result got = run<T>(gpt);
    EXPECT_NEAR(got.loss, serial.loss, tolerance * std::abs(serial.loss)) << "rank " << tp.rank();
    EXPECT_EQ(got.logit_columns, kModel.vocab_size / parts) << "no rank holds a whole row of the logits";
    for (const ParamInfo& p : gpt.params().infos()) {
      EXPECT_EQ(got.values.at(p.name), piece<T>(p, serial.values.at(p.name))) << p.name << " starts elsewhere";
      const std::vector<double> want = piece<T>(p, serial.grads.at(p.name));
      const std::vector<double>& g = got.grads.at(p.name);
      double scale = 0, worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(g[i] - want[i]));
      }
      EXPECT_LE(worst, tolerance * scale) << p.name << " on rank " << tp.rank() << " of " << parts;
    }
  });
}

TEST(TensorParallel, HeadsMlpAndVocabularySplitOverTwoRanksEqualSerial) { expect_tensor_parallel_equals_serial<double>(2, 1e-12); }
TEST(TensorParallel, HeadsMlpAndVocabularySplitOverFourRanksEqualSerial) { expect_tensor_parallel_equals_serial<double>(4, 1e-12); }
// f32: each gradient within 1e-5 of its tensor's largest element (about 80 ulps of
// accumulated reordering over the 64- and 256-long sums the split cuts).
TEST(TensorParallel, Float32WithinTheStatedTolerance) { expect_tensor_parallel_equals_serial<float>(2, 1e-5); }
// Sequence parallelism: LayerNorms and residuals on each rank's rows, all-gathers and
// reduce-scatters in place of the all-reduces; the same model, to rounding.
TEST(TensorParallel, SequenceParallelOverTwoRanksEqualsSerial) { expect_tensor_parallel_equals_serial<double>(2, 1e-12, true); }
TEST(TensorParallel, SequenceParallelOverFourRanksEqualsSerial) { expect_tensor_parallel_equals_serial<double>(4, 1e-12, true); }
TEST(TensorParallel, SequenceParallelWithRecomputeEqualsSerial) {
  expect_tensor_parallel_equals_serial<double>(2, 1e-12, true, nn::Recompute::kFull);
  expect_tensor_parallel_equals_serial<double>(2, 1e-12, true, nn::Recompute::kSelective);
}
TEST(TensorParallel, SequenceParallelFloat32WithinTheStatedTolerance) {
  expect_tensor_parallel_equals_serial<float>(2, 1e-5, true);
}

}  // namespace
}  // namespace loom::parallel
