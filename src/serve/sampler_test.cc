#include "loom/serve/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace loom::serve {
namespace {

// How often each id is drawn in n draws.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplingParams& p, int n) {
  Sampler sampler(static_cast<int64_t>(logits.size()));
  Rng rng(11, /*stream=*/3);
  std::vector<double> f(logits.size());
  for (int i = 0; i < n; ++i) f[static_cast<size_t>(sampler.pick(logits.data(), p, rng))] += 1.0 / n;
  return f;
}

// Each frequency within 5 standard errors of the probability it estimates.
void expect_drawn_as(const std::vector<double>& f, const std::vector<double>& prob, int n) {
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_NEAR(f[i], prob[i], 5 * std::sqrt(prob[i] * (1 - prob[i]) / n) + 1e-9) << "id " << i;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature, const std::vector<int>& keep) {
  std::vector<double> p(logits.size());
  double sum = 0;
  for (int id : keep) sum += (p[static_cast<size_t>(id)] = std::exp(logits[static_cast<size_t>(id)] / temperature));
  for (double& x : p) x /= sum;
  return p;
}

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f, 1.5f, -0.5f, 0.2f};
constexpr int kDraws = 200000;

TEST(Sampler, DrawsFromTheSoftmaxAtTheTemperature) {
  for (double t : {1.0, 0.5, 2.0}) {
    SCOPED_TRACE(t);
    expect_drawn_as(frequencies(kLogits, {.temperature = t}, kDraws), softmax(kLogits, t, {0, 1, 2, 3, 4, 5, 6, 7}), kDraws);
  }
}

TEST(Sampler, TopKDrawsAmongTheKLikeliest) {
  // Likeliest first: 1 (2.0), 5 (1.5), 3 (1.0).
  expect_drawn_as(frequencies(kLogits, {.temperature = 1, .top_k = 3}, kDraws), softmax(kLogits, 1, {1, 5, 3}), kDraws);
}

TEST(Sampler, TopPDrawsAmongTheFewestHoldingTheShare) {
  const std::vector<double> all = softmax(kLogits, 1, {0, 1, 2, 3, 4, 5, 6, 7});
  // 1 and 5 hold 0.380 + 0.231 = 0.611 of the mass; with 3 (0.140) 0.751.
  ASSERT_GT(all[1] + all[5], 0.6);
  ASSERT_LT(all[1] + all[5], 0.7);
  ASSERT_GT(all[1] + all[5] + all[3], 0.7);
  expect_drawn_as(frequencies(kLogits, {.temperature = 1, .top_p = 0.7}, kDraws), softmax(kLogits, 1, {1, 5, 3}), kDraws);
  expect_drawn_as(frequencies(kLogits, {.temperature = 1, .top_p = 0.6}, kDraws), softmax(kLogits, 1, {1, 5}), kDraws);
  expect_drawn_as(frequencies(kLogits, {.temperature = 1, .top_k = 2, .top_p = 0.3}, kDraws), softmax(kLogits, 1, {1}), kDraws);
}

TEST(Sampler, EqualLogitsAreOrderedById) {
  const std::vector<float> flat = {1, 3, 3, 3, 0};
  expect_drawn_as(frequencies(flat, {.temperature = 1, .top_k = 1}, 1000), {0, 1, 0, 0, 0}, 1000);
  expect_drawn_as(frequencies(flat, {.temperature = 1, .top_k = 2}, kDraws), {0, 0.5, 0.5, 0, 0}, kDraws);
  Sampler sampler(5);
  Rng rng(1);
  EXPECT_EQ(sampler.pick(flat.data(), {.temperature = 0}, rng), 1);
}

// A GPT-2-sized vocabulary, where the nucleus is found a few candidates at a time: every
// draw lies in the nucleus a full sort gives, and the same seed gives the same draws.
TEST(Sampler, NucleusOfALargeVocabularyMatchesAFullSort) {
  const int64_t v = 50257;
  std::vector<float> logits(static_cast<size_t>(v));
  Rng g(5);
  for (float& x : logits) x = 3 * g.normal();
  for (double top_p : {0.05, 0.5, 0.9, 0.999}) {
    SCOPED_TRACE(top_p);
    std::vector<int32_t> order(static_cast<size_t>(v));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const float mx = logits[order[0]];
    double sum = 0, mass = 0;
    for (float x : logits) sum += std::exp(x - mx);
    size_t nucleus = 0;
    while (mass < top_p * sum) mass += std::exp(logits[order[nucleus++]] - mx);
    std::vector<bool> in(static_cast<size_t>(v));
    for (size_t i = 0; i < nucleus; ++i) in[static_cast<size_t>(order[i])] = true;
    Sampler a(v), b(v);
    Rng ra(9), rb(9);
    for (int i = 0; i < 50; ++i) {
      const int32_t id = a.pick(logits.data(), {.temperature = 1, .top_p = top_p}, ra);
      ASSERT_TRUE(in[static_cast<size_t>(id)]) << "draw " << i << ": id " << id << " outside the nucleus of " << nucleus;
      ASSERT_EQ(id, b.pick(logits.data(), {.temperature = 1, .top_p = top_p}, rb));
    }
  }
}

}  // namespace
}  // namespace loom::serve
