// Distillation's loss (kernels/distill.h): the kernels equal their reference twins, by
// pieces of the columns as by whole rows; the gradient is the loss's (finite differences);
// alpha = 0 is the cross-entropy.
#include "kernels/distill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/reference/reference.h"
#include "loom/core/rng.h"

namespace loom::kernels {
namespace {

constexpr int64_t kN = 5, kV = 19;
const int64_t kBegins[] = {0, 6, 12, kV};  // three pieces of unequal widths
const std::vector<int32_t> kTargets = {3, 18, 0, 7, 12};

std::vector<double> random(int64_t count, uint64_t seed, double scale) {
  Rng r(seed);
  std::vector<double> v(static_cast<size_t>(count));
  for (auto& x : v) x = scale * r.normal();
  return v;
}

// A teacher's softened probabilities: softmax(t / temp) of random logits t.
std::vector<double> soft_targets(double temp) {
  std::vector<double> t = random(kN * kV, 2, 3.0), p(t.size());
  for (int64_t i = 0; i < kN; ++i) {
    double s = 0;
    for (int64_t j = 0; j < kV; ++j) s += std::exp(t[i * kV + j] / temp);
    for (int64_t j = 0; j < kV; ++j) p[i * kV + j] = std::exp(t[i * kV + j] / temp) / s;
  }
  p[3] = 0;  // a zero probability: p log p is 0
  return p;
}

struct Result {
  std::vector<double> loss, dlogits;
};

// The layer's arithmetic over `pieces` pieces of the columns, with the kernels given.
template <typename T, typename Max, typename CeSums, typename KdSums, typename Backward>
Result run(const std::vector<double>& logits, const std::vector<double>& soft, double alpha, double temp, int pieces,
           Max slice_max, CeSums ce_sums, KdSums kd_sums, Backward backward) {
  const std::vector<int64_t> begins = pieces == 1 ? std::vector<int64_t>{0, kV}
                                                  : std::vector<int64_t>(kBegins, kBegins + pieces + 1);
  std::vector<std::vector<T>> z(pieces), p(pieces);
  for (int q = 0; q < pieces; ++q)
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t j = begins[q]; j < begins[q + 1]; ++j) {
        z[q].push_back(static_cast<T>(logits[i * kV + j]));
        p[q].push_back(static_cast<T>(soft[i * kV + j]));
      }
  std::vector<T> mx(kN, -INFINITY), m(kN), ce(2 * kN, 0), kd(3 * kN, 0), ce_piece(2 * kN), kd_piece(3 * kN);
  for (int q = 0; q < pieces; ++q) {
    slice_max(m.data(), z[q].data(), kN, begins[q + 1] - begins[q]);
    for (int64_t i = 0; i < kN; ++i) mx[i] = std::max(mx[i], m[i]);
  }
  for (int q = 0; q < pieces; ++q) {
    const int64_t w = begins[q + 1] - begins[q];
    ce_sums(ce_piece.data(), z[q].data(), kTargets.data(), mx.data(), kN, w, begins[q]);
    kd_sums(kd_piece.data(), z[q].data(), p[q].data(), mx.data(), kN, w, static_cast<T>(temp));
    for (int64_t i = 0; i < 2 * kN; ++i) ce[i] += ce_piece[i];
    for (int64_t i = 0; i < 3 * kN; ++i) kd[i] += kd_piece[i];
  }
  Result r{std::vector<double>(kN), std::vector<double>(kN * kV)};
  for (int64_t i = 0; i < kN; ++i) {
    const double hard = std::log(ce[i]) + mx[i] - ce[kN + i];
    const double kl = kd[2 * kN + i] - kd[kN + i] / temp + mx[i] / temp + std::log(kd[i]);
    r.loss[i] = (1 - alpha) * hard + alpha * temp * temp * kl;
  }
  for (int q = 0; q < pieces; ++q) {
    const int64_t w = begins[q + 1] - begins[q];
    backward(z[q].data(), z[q].data(), kTargets.data(), p[q].data(), mx.data(), ce.data(), kd.data(), T(1),
             static_cast<T>(alpha), static_cast<T>(temp), kN, w, begins[q]);
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t j = 0; j < w; ++j) r.dlogits[i * kV + begins[q] + j] = z[q][i * w + j];
  }
  return r;
}

Result reference_run(const std::vector<double>& logits, const std::vector<double>& soft, double alpha, double temp,
                     int pieces) {
  return run<double>(logits, soft, alpha, temp, pieces, reference::cross_entropy_slice_max<double>,
                     reference::cross_entropy_slice_sums<double>, reference::distill_slice_sums<double>,
                     reference::distill_slice_backward<double>);
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(Distill, KernelsEqualTheReferenceWholeAndByPieces) {
  const auto logits = random(kN * kV, 1, 2.0);
  for (double temp : {1.0, 2.0, 0.5}) {
    const auto soft = soft_targets(temp);
    const Result want = reference_run(logits, soft, 0.7, temp, 1);
    for (int pieces : {1, 3}) {
      const Result ref = reference_run(logits, soft, 0.7, temp, pieces);
      EXPECT_LT(max_diff(ref.loss, want.loss), 1e-13);
      EXPECT_LT(max_diff(ref.dlogits, want.dlogits), 1e-13);
      const Result f64 = run<double>(logits, soft, 0.7, temp, pieces, cross_entropy_slice_max<double>,
                                     cross_entropy_slice_sums<double>, distill_slice_sums<double>,
                                     distill_slice_backward<double>);
      EXPECT_LT(max_diff(f64.loss, want.loss), 1e-12) << temp;
      EXPECT_LT(max_diff(f64.dlogits, want.dlogits), 1e-12) << temp;
      const Result f32 = run<float>(logits, soft, 0.7, temp, pieces, cross_entropy_slice_max<float>,
                                    cross_entropy_slice_sums<float>, distill_slice_sums<float>,
                                    distill_slice_backward<float>);
      EXPECT_LT(max_diff(f32.loss, want.loss), 2e-5) << temp;
      EXPECT_LT(max_diff(f32.dlogits, want.dlogits), 2e-6) << temp;
    }
  }
}

TEST(Distill, GradientIsTheLossesByFiniteDifferences) {
  auto logits = random(kN * kV, 3, 2.0);
  const double temp = 2.0, alpha = 0.6, h = 1e-6;
  const auto soft = soft_targets(temp);
  const Result r = reference_run(logits, soft, alpha, temp, 3);
  for (int64_t i = 0; i < kN * kV; i += 7) {
    const double x = logits[i];
    logits[i] = x + h;
    const double up = reference_run(logits, soft, alpha, temp, 3).loss[i / kV];
    logits[i] = x - h;
    const double down = reference_run(logits, soft, alpha, temp, 3).loss[i / kV];
    logits[i] = x;
    EXPECT_NEAR((up - down) / (2 * h), r.dlogits[i], 1e-7) << i;
  }
}

TEST(Distill, AlphaZeroIsTheCrossEntropy) {
  const auto logits = random(kN * kV, 4, 2.0);
  const Result kd = reference_run(logits, soft_targets(1.0), 0.0, 1.0, 1);
  std::vector<double> loss(kN), dl(kN * kV);
  reference::cross_entropy_forward(loss.data(), logits.data(), kTargets.data(), kN, kV);
  reference::cross_entropy_backward(dl.data(), logits.data(), kTargets.data(), 1.0, kN, kV);
  EXPECT_LT(max_diff(kd.loss, loss), 1e-13);
  EXPECT_LT(max_diff(kd.dlogits, dl), 1e-13);
}

}  // namespace
}  // namespace loom::kernels
