// The GPU trainer against the CPU path (ctest label `gpu`; every test but the allocator's
// bins skips, saying why, where no CUDA device is visible): the caching allocator rounds,
// reuses and names what it cannot give; the attention kernels equal the CPU's blocked attention with bf16 products; one
// micro-batch's gradients equal the CPU's f32 gradients to bf16's precision, tensor by
// tensor; 20 steps of gpt-nano and gpt-mini follow the CPU's bf16 loss curve; and two runs
// on the GPU give the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "comm/comm_testing.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "kernels/attention.h"
#include "kernels/precision.h"
#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/gpu/gpu.h"
#include "loom/nn/gpt.h"
#include "loom/optim/optim.h"
#include "loom_testing.h"

namespace loom::gpu {
namespace {

#define LOOM_NEEDS_GPU()                                                             \
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device visible to this process"; \
  static_assert(true)

float bf16_round(float x) { return std::bit_cast<float>(static_cast<uint32_t>(kernels::bf16_bits(x)) << 16); }

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = kernels::bf16_bits(x[i]);
  return out;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(x[i]) << 16);
  return out;
}

template <typename T>
T* upload(DeviceAllocator& alloc, std::vector<DeviceBuffer>& keep, const std::vector<T>& host) {
  keep.emplace_back(alloc, host.size() * sizeof(T), "test input");
  check(cudaMemcpy(keep.back().as<void>(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return keep.back().as<T>();
}

template <typename T>
std::vector<T> download(const T* dev, size_t n) {
  std::vector<T> out(n);
  check(cudaMemcpy(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

// Largest |a - b| over the largest |b|: the error relative to the tensor's scale.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// The allocator's bins (no device needed): 512-byte steps under 1 MiB, 2 MiB steps above.
TEST(GpuMemory, SizesRoundToTheirBins) {
  EXPECT_EQ(DeviceAllocator::rounded(0), 512u);
  EXPECT_EQ(DeviceAllocator::rounded(1), 512u);
  EXPECT_EQ(DeviceAllocator::rounded(513), 1024u);
  EXPECT_EQ(DeviceAllocator::rounded((1 << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(DeviceAllocator::rounded(1 << 20), size_t{2} << 20);
  EXPECT_EQ(DeviceAllocator::rounded((3 << 20) + 1), size_t{4} << 20);
}

TEST(GpuMemory, TheCacheServesTheNextStepAndTheErrorNamesTheBuffer) {
  LOOM_NEEDS_GPU();
  std::printf("device 0: %s\n", device_description(0).c_str());
  DeviceAllocator alloc;
  { DeviceBuffer a(alloc, 3 << 20, "first"); }
  const MemoryStats before = alloc.stats();
  EXPECT_EQ(before.in_use, 0);
  EXPECT_EQ(before.reserved, int64_t{4} << 20);  // 3 MiB rounds to 2 MiB steps
  { DeviceBuffer b(alloc, (3 << 20) + 100, "second"); }
  EXPECT_EQ(alloc.stats().cache_hits, 1);
  EXPECT_EQ(alloc.stats().reserved, before.reserved);
  try {
    DeviceBuffer huge(alloc, size_t{1} << 50, "the huge test buffer");
    FAIL() << "a petabyte was allocated";
  } catch (const RuntimeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of GPU memory for the huge test buffer"), std::string::npos) << what;
    EXPECT_NE(what.find("1125899906842624 bytes asked"), std::string::npos) << what;
  }
}

// The GPU attention (tensor cores, bf16 probabilities) against the CPU's blocked attention
// reading its operands as bf16, on T that are not multiples of the 64-row blocks (one
// block and a part, three and a part). Tolerance: both round the output and the gradients
// to bf16 (2^-8 relative), and add the products in other orders; 2% of each tensor's
// largest element holds that with margin. Returns the GPU's y, lse and dqkv, as their bits.
struct AttentionBits {
  std::vector<uint16_t> y;
  std::vector<float> lse;
  std::vector<uint16_t> dqkv;
};
AttentionBits expect_attention_matches_the_cpu(int64_t hs, int64_t t, kern::AttentionKernels kernels) {
  const char* name = kernels == kern::AttentionKernels::kMma    ? "mma"
                     : kernels == kern::AttentionKernels::kMmaX4 ? "mma-x4"
                                                                  : "wmma";
  const int64_t b = 2, nh = 3, c = nh * hs;
  Rng r(static_cast<uint64_t>(hs));
  std::vector<float> qkv(size_t(b * t * 3 * c)), dy(size_t(b * t * c));
  for (float& x : qkv) x = bf16_round(static_cast<float>(r.normal()));
  for (float& x : dy) x = bf16_round(static_cast<float>(r.normal() * 0.1));
  std::vector<float> y(dy.size()), lse(size_t(b * nh * t)), dqkv(qkv.size());
  kernels::attention_forward(y.data(), lse.data(), qkv.data(), b, t, c, nh, DType::kBF16);
  kernels::attention_backward(dqkv.data(), dy.data(), qkv.data(), y.data(), lse.data(), b, t, c, nh, DType::kBF16);

  DeviceAllocator alloc;
  std::vector<DeviceBuffer> keep;
  const uint16_t* d_qkv = upload(alloc, keep, to_bf16(qkv));
  const uint16_t* d_dy = upload(alloc, keep, to_bf16(dy));
  uint16_t* d_y = upload(alloc, keep, std::vector<uint16_t>(y.size()));
  float* d_lse = upload(alloc, keep, std::vector<float>(lse.size()));
  float* d_dpre = upload(alloc, keep, std::vector<float>(lse.size()));
  uint16_t* d_dqkv = upload(alloc, keep, std::vector<uint16_t>(qkv.size()));
  kern::attention_forward(d_y, d_lse, d_qkv, b, t, c, nh, nullptr, kernels);
  // backward from the GPU's own output, as training runs it
  kern::attention_backward(d_dqkv, d_dpre, d_dy, d_qkv, d_y, d_lse, b, t, c, nh, nullptr, kernels);
  check(cudaDeviceSynchronize(), "attention kernels");
  AttentionBits out{download(d_y, y.size()), download(d_lse, lse.size()), download(d_dqkv, qkv.size())};
  const double y_err = relative_error(from_bf16(out.y), y);
  const double lse_err = relative_error(out.lse, lse);
  std::printf("attention %s, head size %lld, T %lld: y %.5f, lse %.6f", name, static_cast<long long>(hs),
              static_cast<long long>(t), y_err, lse_err);
  EXPECT_LT(y_err, 0.02) << name << " y, head size " << hs << ", T " << t;
  EXPECT_LT(lse_err, 1e-3) << name << " lse, head size " << hs << ", T " << t;
  const std::vector<float> got = from_bf16(out.dqkv);
  for (int part = 0; part < 3; ++part) {
    std::vector<float> g, w;
    for (int64_t row = 0; row < b * t; ++row)
      for (int64_t j = 0; j < c; ++j) {
        g.push_back(got[size_t(row * 3 * c + part * c + j)]);
        w.push_back(dqkv[size_t(row * 3 * c + part * c + j)]);
      }
    const double err = relative_error(g, w);
    std::printf(", d%c %.5f", "qkv"[part], err);
    EXPECT_LT(err, 0.02) << name << " d" << "qkv"[part] << ", head size " << hs << ", T " << t;
  }
  std::printf(" of each tensor's largest element\n");
  return out;
}

TEST(GpuAttention, EqualsTheCpuAttentionWithBf16Products) {
  LOOM_NEEDS_GPU();
  for (const auto kernels : {kern::AttentionKernels::kMma, kern::AttentionKernels::kMmaX4, kern::AttentionKernels::kWmma})
    for (const int64_t hs : {32, 64})
      for (const int64_t t : {100, 230}) expect_attention_matches_the_cpu(hs, t, kernels);
}

// kMmaX4 loads the same fragments another way and runs the same multiply-adds in the same
// order as kMma: the same bits, forward and backward.
TEST(GpuAttention, MmaX4GivesMmasBits) {
  LOOM_NEEDS_GPU();
  for (const int64_t hs : {32, 64})
    for (const int64_t t : {100, 230}) {
      const AttentionBits mma = expect_attention_matches_the_cpu(hs, t, kern::AttentionKernels::kMma);
      const AttentionBits x4 = expect_attention_matches_the_cpu(hs, t, kern::AttentionKernels::kMmaX4);
      EXPECT_TRUE(mma.y == x4.y) << "y, head size " << hs << ", T " << t;
      EXPECT_EQ(std::memcmp(mma.lse.data(), x4.lse.data(), mma.lse.size() * sizeof(float)), 0)
          << "lse, head size " << hs << ", T " << t;
      EXPECT_TRUE(mma.dqkv == x4.dqkv) << "dqkv, head size " << hs << ", T " << t;
    }
}

// LayerNorm backward at widths the model tests do not reach (GPT-2's 768, 1,024, and 1,000,
// which is not a multiple of 8 and takes the scalar kernel), on 70 rows (two blocks and a
// part), against the formula in double. Tolerance: dx is rounded to bf16 (2^-8 relative);
// the weight and bias gradients are f32 sums of 70 terms.
void expect_layernorm_backward_matches(int64_t c) {
  const int64_t n = 70;
  Rng r(static_cast<uint64_t>(c));
  std::vector<float> x(size_t(n * c)), dy(x.size()), dres(x.size()), w(static_cast<size_t>(c)), mean(static_cast<size_t>(n)),
      rstd(static_cast<size_t>(n));
  for (float& v : x) v = bf16_round(static_cast<float>(r.normal()));
  for (float& v : dy) v = bf16_round(static_cast<float>(r.normal()));
  for (float& v : dres) v = bf16_round(static_cast<float>(r.normal()));
  for (float& v : w) v = static_cast<float>(1.0 + 0.1 * r.normal());
  std::vector<double> want_dx(x.size()), want_dw(static_cast<size_t>(c)), want_db(static_cast<size_t>(c));
  for (int64_t row = 0; row < n; ++row) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += x[size_t(row * c + j)];
    mu /= double(c);
    for (int64_t j = 0; j < c; ++j) var += (x[size_t(row * c + j)] - mu) * (x[size_t(row * c + j)] - mu);
    const double rs = 1.0 / std::sqrt(var / double(c) + 1e-5);
    mean[size_t(row)] = float(mu);
    rstd[size_t(row)] = float(rs);
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < c; ++j) {
      const size_t i = size_t(row * c + j);
      const double xh = (x[i] - mu) * rs, gw = double(dy[i]) * w[size_t(j)];
      s1 += gw;
      s2 += gw * xh;
      want_dw[size_t(j)] += dy[i] * xh;
      want_db[size_t(j)] += dy[i];
    }
    for (int64_t j = 0; j < c; ++j) {
      const size_t i = size_t(row * c + j);
      const double xh = (x[i] - mu) * rs;
      want_dx[i] = rs * (double(dy[i]) * w[size_t(j)] - s1 / double(c) - xh * s2 / double(c)) + dres[i];
    }
  }
  DeviceAllocator alloc;
  std::vector<DeviceBuffer> keep;
  const int64_t p = kern::layernorm_partials(n);
  const uint16_t* d_x = upload(alloc, keep, to_bf16(x));
  const uint16_t* d_dy = upload(alloc, keep, to_bf16(dy));
  const uint16_t* d_dres = upload(alloc, keep, to_bf16(dres));
  const float* d_w = upload(alloc, keep, w);
  const float* d_mean = upload(alloc, keep, mean);
  const float* d_rstd = upload(alloc, keep, rstd);
  uint16_t* d_dx = upload(alloc, keep, std::vector<uint16_t>(x.size()));
  float* d_parts = upload(alloc, keep, std::vector<float>(size_t(2 * p * c)));
  float* d_dw = upload(alloc, keep, std::vector<float>(size_t(c)));
  float* d_db = upload(alloc, keep, std::vector<float>(size_t(c)));
  kern::layernorm_backward(d_dx, d_parts, d_parts + p * c, d_dy, d_x, d_mean, d_rstd, d_w, d_dres, n, c, nullptr);
  kern::add_partials(d_dw, d_parts, p, c, nullptr);
  kern::add_partials(d_db, d_parts + p * c, p, c, nullptr);
  check(cudaDeviceSynchronize(), "layernorm_backward");
  const auto as_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const double dx_err = relative_error(from_bf16(download(d_dx, x.size())), as_float(want_dx));
  const double dw_err = relative_error(download(d_dw, size_t(c)), as_float(want_dw));
  const double db_err = relative_error(download(d_db, size_t(c)), as_float(want_db));
  std::printf("layernorm backward, C %lld: dx %.5f, dw %.6f, db %.6f of each tensor's largest element\n",
              static_cast<long long>(c), dx_err, dw_err, db_err);
  EXPECT_LT(dx_err, 0.01) << "C " << c;
  EXPECT_LT(dw_err, 1e-4) << "C " << c;
  EXPECT_LT(db_err, 1e-4) << "C " << c;
}

TEST(GpuKernels, LayerNormBackwardEqualsItsFormula) {
  LOOM_NEEDS_GPU();
  for (const int64_t c : {768, 1024, 1000}) expect_layernorm_backward_matches(c);
}

// The loss at GPT-2's vocabulary (50,257 columns in rows of 50,304) and at one that is not
// a multiple of 8 wide (the scalar kernel), against log-sum-exp and softmax in double.
void expect_cross_entropy_matches(int64_t v, int64_t ldv) {
  const int64_t n = 5;
  const float dscale = 1.0f / float(n);
  Rng r(static_cast<uint64_t>(v));
  std::vector<float> logits(size_t(n * ldv), 0.0f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t j = 0; j < v; ++j) logits[size_t(row * ldv + j)] = bf16_round(static_cast<float>(3.0 * r.normal()));
    targets[size_t(row)] = static_cast<int32_t>(r.below(uint64_t(v)));
  }
  std::vector<float> want_loss(static_cast<size_t>(n)), want_grad(logits.size(), 0.0f);
  for (int64_t row = 0; row < n; ++row) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(logits[size_t(row * ldv + j)]));
    for (int64_t j = 0; j < v; ++j) s += std::exp(logits[size_t(row * ldv + j)] - mx);
    const double lse = mx + std::log(s);
    want_loss[size_t(row)] = float(lse - logits[size_t(row * ldv + targets[size_t(row)])]);
    for (int64_t j = 0; j < v; ++j)
      want_grad[size_t(row * ldv + j)] =
          float((std::exp(logits[size_t(row * ldv + j)] - lse) - (j == targets[size_t(row)] ? 1.0 : 0.0)) * dscale);
  }
  DeviceAllocator alloc;
  std::vector<DeviceBuffer> keep;
  uint16_t* d_logits = upload(alloc, keep, to_bf16(logits));
  const int32_t* d_targets = upload(alloc, keep, targets);
  float* d_losses = upload(alloc, keep, std::vector<float>(size_t(n)));
  kern::cross_entropy(d_losses, d_logits, d_targets, n, v, ldv, dscale, nullptr);
  check(cudaDeviceSynchronize(), "cross_entropy");
  const std::vector<float> loss = download(d_losses, size_t(n));
  const std::vector<float> grad = from_bf16(download(d_logits, logits.size()));
  for (int64_t row = 0; row < n; ++row)
    EXPECT_NEAR(loss[size_t(row)], want_loss[size_t(row)], 1e-4 * std::fabs(want_loss[size_t(row)])) << "row " << row;
  const double err = relative_error(grad, want_grad);
  std::printf("cross-entropy, V %lld in rows of %lld: gradient %.5f of its largest element\n",
              static_cast<long long>(v), static_cast<long long>(ldv), err);
  EXPECT_LT(err, 0.01) << "V " << v;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t j = v; j < ldv; ++j) EXPECT_EQ(grad[size_t(row * ldv + j)], 0.0f) << "padding column " << j;
}

TEST(GpuKernels, CrossEntropyEqualsLogSumExpAndSoftmax) {
  LOOM_NEEDS_GPU();
  expect_cross_entropy_matches(50257, 50304);
  expect_cross_entropy_matches(301, 301);
}

// The bias gradients' column sums at GPT-2's widths (and one not a multiple of 8, the
// scalar kernel), over 600 rows (two chunks and a part), then added up: against double.
TEST(GpuKernels, ColumnSumsEqualTheSumsInDouble) {
  LOOM_NEEDS_GPU();
  for (const int64_t m : {768, 2304, 3072, 301}) {
    const int64_t n = 600, parts = kern::column_sum_parts(n);
    Rng r(static_cast<uint64_t>(m));
    std::vector<float> y(size_t(n * m));
    for (float& v : y) v = bf16_round(static_cast<float>(r.normal()));
    std::vector<float> want(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t row = 0; row < n; ++row) s += y[size_t(row * m + j)];
      want[size_t(j)] = static_cast<float>(s);
    }
    DeviceAllocator alloc;
    std::vector<DeviceBuffer> keep;
    const uint16_t* d_y = upload(alloc, keep, to_bf16(y));
    float* d_parts = upload(alloc, keep, std::vector<float>(size_t(parts * m)));
    float* d_sum = upload(alloc, keep, std::vector<float>(static_cast<size_t>(m)));
    kern::column_sums(d_parts, d_y, n, m, nullptr);
    kern::add_partials(d_sum, d_parts, parts, m, nullptr);
    check(cudaDeviceSynchronize(), "column_sums");
    EXPECT_LT(relative_error(download(d_sum, static_cast<size_t>(m)), want), 1e-5) << "M " << m;
  }
}

GptTrainerConfig trainer_config(int64_t b) {
  GptTrainerConfig tc;
  tc.micro_batch = b;
  tc.optimizer.weight_decay = 0.1;
  tc.max_grad_norm = 1.0;
  return tc;
}

// One micro-batch's gradients, tensor by tensor, against the CPU model in f32: what bf16
// activations and products change. Tolerance: 3% of each gradient's largest element (bf16
// keeps 8 bits; through two blocks of rounded activations the CPU's own bf16 mode differs
// from f32 by up to 2% here). With the epilogues fused on cuBLASLt and with Loom's kernels.
void expect_gradients_match_the_cpu(const nn::GptConfig& cfg, bool fused) {
  const int64_t b = 4;
  nn::Gpt cpu(cfg);
  cpu.init(3);
  auto [tokens, targets] = testing::random_tokens(b, cfg.seq_len, cfg.vocab_size, 11);
  nn::GptCtx ctx;
  const double cpu_loss = cpu.forward(tokens, targets, ctx);
  cpu.backward(ctx, 1.0);

  GptTrainerConfig tc = trainer_config(b);
  tc.fused_epilogues = fused;
  GptTrainer gpu(cpu, tc);
  const auto span = [](const Tensor& x) { return std::span<const int32_t>(x.data<int32_t>(), size_t(x.numel())); };
  const double gpu_loss = gpu.forward_backward(span(tokens), span(targets));
  std::printf("d_model %lld, epilogues: %s\n", static_cast<long long>(cfg.d_model), gpu.epilogues().c_str());
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss);
  nn::Gpt got(cfg);
  gpu.copy_grads_to(got.params());
  for (const ParamInfo& p : cpu.params().infos()) {
    const Tensor want = cpu.params().grad(cpu.params().find(p.name)), have = got.params().grad(got.params().find(p.name));
    const std::vector<float> w(want.data<float>(), want.data<float>() + want.numel());
    const std::vector<float> h(have.data<float>(), have.data<float>() + have.numel());
    const double err = relative_error(h, w);
    std::printf("  %-32s gradient error %.4f of its largest element\n", p.name.c_str(), err);
    EXPECT_LT(err, 0.03) << p.name << (fused ? " (cuBLASLt epilogues)" : " (Loom's epilogues)");
  }
}

TEST(GpuGpt, GradientsEqualTheCpuModelsToBf16Precision) {
  LOOM_NEEDS_GPU();
  for (const bool fused : {true, false}) {
    expect_gradients_match_the_cpu({.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256}, fused);
    expect_gradients_match_the_cpu({.n_layer = 2, .n_head = 2, .d_model = 128, .seq_len = 96, .vocab_size = 301},
                                   fused);
  }
}

// 20 steps on the GPU and on the CPU in bf16 mixed precision, from the same weights, on the
// same four batches in turn: the loss curves agree within 2% a step (the tolerance
// bench/precision_curves.sh holds bf16 to against fp32, docs/numerics.md).
void expect_the_cpu_loss_curve(const nn::GptConfig& cfg, int64_t b) {
  const int steps = 20;
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (uint64_t s = 0; s < 4; ++s) batches.push_back(testing::random_tokens(b, cfg.seq_len, cfg.vocab_size, 40 + s));
  const auto span = [](const Tensor& x) { return std::span<const int32_t>(x.data<int32_t>(), size_t(x.numel())); };
  const GptTrainerConfig tc = trainer_config(b);
  const optim::ScheduleConfig schedule{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 5, .total_steps = steps};

  nn::Gpt cpu(cfg);
  cpu.init(7);
  GptTrainer gpu(cpu, tc);
  cpu.set_precision(DType::kBF16);
  auto opt = optim::make_optimizer(tc.optimizer, cpu.params());
  for (int step = 0; step < steps; ++step) {
    const auto& [tokens, targets] = batches[size_t(step) % batches.size()];
    const double lr = optim::lr_at(schedule, step);
    cpu.params().zero_grads();
    nn::GptCtx ctx;
    const double cpu_loss = cpu.forward(tokens, targets, ctx);
    cpu.backward(ctx, 1.0);
    const double cpu_norm = optim::clip_grad_norm(cpu.params(), tc.max_grad_norm);
    opt->step(lr);
    const double gpu_loss = gpu.forward_backward(span(tokens), span(targets));
    const double gpu_norm = gpu.step(lr);
    EXPECT_NEAR(gpu_loss, cpu_loss, 0.02 * cpu_loss) << "step " << step << ", d_model " << cfg.d_model;
    EXPECT_NEAR(gpu_norm, cpu_norm, 0.1 * cpu_norm) << "step " << step << ", d_model " << cfg.d_model;
    if (step == 0 || step == steps - 1)
      std::printf("d_model %lld step %d: loss cpu %.5f gpu %.5f, grad norm cpu %.4f gpu %.4f\n",
                  static_cast<long long>(cfg.d_model), step, cpu_loss, gpu_loss, cpu_norm, gpu_norm);
  }
}

TEST(GpuGpt, TwentyStepsFollowTheCpuLossCurve) {
  LOOM_NEEDS_GPU();
  expect_the_cpu_loss_curve({.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256}, 8);
  expect_the_cpu_loss_curve({.n_layer = 4, .n_head = 4, .d_model = 256, .seq_len = 256, .vocab_size = 256}, 4);
}

// Every reduction adds in a fixed order and cuBLAS picks the same kernels for the same
// shapes: two trainers from the same weights end with the same bits. From the second
// step on the allocator serves every activation from its cache.
TEST(GpuGpt, TwoRunsGiveTheSameBitsAndReuseTheirMemory) {
  LOOM_NEEDS_GPU();
  const nn::GptConfig cfg{.n_layer = 2, .n_head = 4, .d_model = 128, .seq_len = 128, .vocab_size = 500};
  auto [tokens, targets] = testing::random_tokens(4, cfg.seq_len, cfg.vocab_size, 5);
  const auto span = [](const Tensor& x) { return std::span<const int32_t>(x.data<int32_t>(), size_t(x.numel())); };
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    nn::Gpt model(cfg);
    model.init(1);
    GptTrainer gpu(model, trainer_config(4));
    MemoryStats after_first;
    for (int step = 0; step < 3; ++step) {
      gpu.forward_backward(span(tokens), span(targets));
      gpu.step(1e-3);
      if (step == 0) after_first = gpu.memory();
    }
    const MemoryStats after = gpu.memory();
    EXPECT_EQ(after.reserved, after_first.reserved);
    EXPECT_GT(after.allocations, after_first.allocations);
    EXPECT_EQ(after.cache_hits - after_first.cache_hits, after.allocations - after_first.allocations)
        << "every buffer of steps 2 and 3 from the cache";
    gpu.copy_params_to(model.params());
    runs.emplace_back(model.params().values().data<float>(),
                      model.params().values().data<float>() + model.params().numel());
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

// The two-rank data parallel test's trainer alone (its model, micro-batch 2, loss scale 0.5,
// no clipping), twice, with either epilogues: every step's gradients and the final weights
// the same bits. Two ranks sharing the GPU with this model did not repeat their bits over
// three steps on the H200 (docs/gpu.md, "Determinism"); this says whether one trainer
// does, and where the first difference is when not.
TEST(GpuGpt, OneTrainerRepeatsItsGradientsStepByStep) {
  LOOM_NEEDS_GPU();
  const nn::GptConfig cfg{.n_layer = 2, .n_head = 3, .d_model = 96, .seq_len = 64, .vocab_size = 301};
  const auto run = [&](bool fused) {
    nn::Gpt model(cfg);
    model.init(4);
    GptTrainerConfig tc = trainer_config(2);
    tc.max_grad_norm = 0;
    tc.fused_epilogues = fused;
    GptTrainer gpu(model, tc);
    std::vector<std::vector<float>> out;  // each step's gradients, then the weights
    for (uint64_t s = 0; s < 3; ++s) {
      auto [x, y] = testing::random_tokens(2, cfg.seq_len, cfg.vocab_size, 70 + 2 * s);
      gpu.forward_backward({x.data<int32_t>(), size_t(x.numel())}, {y.data<int32_t>(), size_t(y.numel())}, 0.5);
      gpu.copy_grads_to(model.params());
      out.emplace_back(model.params().grads().data<float>(),
                       model.params().grads().data<float>() + model.params().numel());
      gpu.step(1e-3);
    }
    gpu.copy_params_to(model.params());
    out.emplace_back(model.params().values().data<float>(),
                     model.params().values().data<float>() + model.params().numel());
    return out;
  };
  const nn::Gpt layout(cfg);
  for (const bool fused : {false, true}) {
    const auto a = run(fused), b = run(fused);
    for (size_t s = 0; s < a.size(); ++s)
      for (const ParamInfo& p : layout.params().infos()) {
        const auto first = a[s].begin() + p.offset, other = b[s].begin() + p.offset;
        ASSERT_TRUE(std::equal(first, first + p.numel, other))
            << (s + 1 < a.size() ? "step " + std::to_string(s) + "'s gradient of " : "the final ") << p.name
            << (fused ? " (cuBLASLt epilogues)" : " (Loom's epilogues)");
      }
  }
}

// Data parallel on one GPU: two ranks (threads) each with a trainer and half of every
// batch, their gradients summed over Loom's transports through pinned memory, against one
// trainer with the whole batch. Both ranks end with the same bits. Against the single
// trainer, the summed gradients differ by the order of the sums and the products' shapes
// (cuBLAS may pick other kernels for half the rows, and bf16 activations round on
// either side of a tie): within 2% of the largest element, as the CPU comparison's 3%; the
// losses of three steps within 0.1%.
TEST(GpuGpt, DataParallelRanksSumTheirGradientsAndAgreeWithOneTrainer) {
  LOOM_NEEDS_GPU();
  const nn::GptConfig cfg{.n_layer = 2, .n_head = 4, .d_model = 128, .seq_len = 64, .vocab_size = 300};
  const int64_t b = 4, half = b / 2, steps = 3;
  std::vector<std::vector<int32_t>> tokens, targets;
  for (uint64_t s = 0; s < steps; ++s) {
    auto [x, y] = testing::random_tokens(b, cfg.seq_len, cfg.vocab_size, 60 + s);
    tokens.emplace_back(x.data<int32_t>(), x.data<int32_t>() + x.numel());
    targets.emplace_back(y.data<int32_t>(), y.data<int32_t>() + y.numel());
  }
  const auto flat = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
  nn::Gpt one(cfg);
  one.init(2);
  std::vector<double> one_losses;
  std::vector<float> one_grads;
  {
    GptTrainer gpu(one, trainer_config(b));
    for (int64_t s = 0; s < steps; ++s) {
      one_losses.push_back(gpu.forward_backward(tokens[size_t(s)], targets[size_t(s)]));
      if (s == 0) {
        gpu.copy_grads_to(one.params());
        one_grads = flat(one.params().grads());
      }
      gpu.step(1e-3);
    }
  }
  std::vector<std::vector<float>> ranks(2), rank_grads(2);
  std::vector<std::vector<double>> rank_losses(2);
  comm::testing::run_ranks(2, {}, [&](comm::Communicator& world) {
    const int r = world.rank();
    nn::Gpt model(cfg);
    model.init(2);
    GptTrainer gpu(model, trainer_config(half));
    const size_t per = size_t(half * cfg.seq_len), first = size_t(r) * per;
    for (int64_t s = 0; s < steps; ++s) {
      const std::span<const int32_t> x(tokens[size_t(s)].data() + first, per), y(targets[size_t(s)].data() + first, per);
      rank_losses[size_t(r)].push_back(gpu.forward_backward(x, y, 0.5));
      const parallel::CommStats st = gpu.all_reduce_grads(world);
      EXPECT_EQ(st.bytes, model.params().numel() * 4);
      if (s == 0) {
        gpu.copy_grads_to(model.params());
        rank_grads[size_t(r)] = flat(model.params().grads());
      }
      gpu.step(1e-3);
    }
    gpu.copy_params_to(model.params());
    ranks[size_t(r)] = flat(model.params().values());
  });
  EXPECT_TRUE(ranks[0] == ranks[1]) << "the two ranks' weights differ";
  EXPECT_TRUE(rank_grads[0] == rank_grads[1]) << "the two ranks' summed gradients differ";
  const double err = relative_error(rank_grads[0], one_grads);
  std::printf("data parallel on one GPU, 2 ranks against 1 trainer: summed gradients within %.5f of the largest\n",
              err);
  EXPECT_LT(err, 0.02);
  for (int64_t s = 0; s < steps; ++s)
    EXPECT_NEAR((rank_losses[0][size_t(s)] + rank_losses[1][size_t(s)]) / 2, one_losses[size_t(s)],
                1e-3 * one_losses[size_t(s)])
        << "step " << s;
}

// NCCL at world size 1 (one GPU cannot hold two NCCL ranks): the communicator is made from
// a Loom communicator's rank 0, and its all-reduce of the gradients leaves every bit as it
// was, as a sum over one rank must; the step after it runs as without it.
TEST(GpuNccl, OneRankAllReduceLeavesTheGradientsAsTheyWere) {
  LOOM_NEEDS_GPU();
  if (!nccl_compiled()) GTEST_SKIP() << "this loom was built without NCCL";
  const nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab_size = 100};
  comm::testing::run_ranks(1, {}, [&](comm::Communicator& world) {
    nn::Gpt model(cfg), twin(cfg);
    model.init(5);
    twin.init(5);
    GptTrainer gpu(model, trainer_config(2)), plain(twin, trainer_config(2));
    auto [x, y] = testing::random_tokens(2, cfg.seq_len, cfg.vocab_size, 9);
    const std::span<const int32_t> xs(x.data<int32_t>(), size_t(x.numel())), ys(y.data<int32_t>(), size_t(y.numel()));
    gpu.forward_backward(xs, ys);
    plain.forward_backward(xs, ys);
    gpu.copy_grads_to(model.params());
    const std::vector<float> before(model.params().grads().data<float>(),
                                    model.params().grads().data<float>() + model.params().numel());
    const parallel::CommStats st = gpu.all_reduce_grads_nccl(world);
    EXPECT_EQ(st.bytes, model.params().numel() * 4);
    gpu.copy_grads_to(model.params());
    const std::vector<float> after(model.params().grads().data<float>(),
                                   model.params().grads().data<float>() + model.params().numel());
    EXPECT_TRUE(before == after);
    EXPECT_EQ(gpu.step(1e-3), plain.step(1e-3));
    gpu.copy_params_to(model.params());
    plain.copy_params_to(twin.params());
    EXPECT_TRUE(std::equal(model.params().values().data<float>(),
                           model.params().values().data<float>() + model.params().numel(),
                           twin.params().values().data<float>()));
  });
}

// Two ranks on one GPU for `steps` steps at ZeRO stage `zero` (0: data parallel), without
// clipping: each rank's final weights and AdamW moments (the shard's under ZeRO, zeros
// elsewhere).
struct ReplicaRun {
  std::vector<std::vector<float>> weights, exp_avg;
};
ReplicaRun run_replicas(int zero, bool fused, uint64_t steps) {
  const nn::GptConfig cfg{.n_layer = 2, .n_head = 3, .d_model = 96, .seq_len = 64, .vocab_size = 301};
  const int64_t half = 2;
  ReplicaRun out{std::vector<std::vector<float>>(2), std::vector<std::vector<float>>(2)};
  comm::testing::run_ranks(2, {}, [&](comm::Communicator& world) {
    const int r = world.rank();
    nn::Gpt model(cfg);
    model.init(4);
    GptTrainerConfig tc = trainer_config(half);
    tc.max_grad_norm = 0;
    tc.fused_epilogues = fused;
    if (zero > 0) {
      tc.zero_rank = r;
      tc.zero_ranks = 2;
    }
    GptTrainer gpu(model, tc);
    for (uint64_t s = 0; s < steps; ++s) {
      auto [x, y] = testing::random_tokens(half, cfg.seq_len, cfg.vocab_size, 70 + 2 * s + uint64_t(r));
      gpu.forward_backward({x.data<int32_t>(), size_t(x.numel())}, {y.data<int32_t>(), size_t(y.numel())}, 0.5);
      if (zero == 2)
        gpu.reduce_scatter_grads(world);
      else
        gpu.all_reduce_grads(world);
      gpu.step(1e-3, zero > 0 ? &world : nullptr);
    }
    gpu.copy_params_to(model.params());
    out.weights[size_t(r)].assign(model.params().values().data<float>(),
                                  model.params().values().data<float>() + model.params().numel());
    Tensor m = Tensor::zeros({model.params().numel()}, DType::kF32), v = Tensor::zeros({model.params().numel()}, DType::kF32);
    gpu.copy_moments_to(m, v);
    out.exp_avg[size_t(r)].assign(m.data<float>(), m.data<float>() + m.numel());
  });
  return out;
}

// ZeRO 1 and 2 on one GPU: each rank keeps and updates its shard's moments and all-gathers
// the weights. ZeRO 1 sums the gradients as data parallelism does, ZeRO 2 reduce-scatters
// them (with two ranks each sum is the one addition a + b either way), and AdamW is
// elementwise: after a step, both ranks' weights equal data parallelism's bit for bit, and
// the ranks' moment shards are data parallelism's moments cut in two. One step, because
// over three steps this two-rank job did not repeat its own bits on the H200 (5.6e-3 to
// 6.0e-3 of the largest weight apart) while cuBLAS's handles had no workspace of their own
// (TwoRanksSharingTheGpuRepeatTheirBits). (ZeRO 2's first run had a model of head size 24,
// which the attention does not take and the trainer refuses since.)
TEST(GpuGpt, ZeroShardsTheMomentsAndEqualsDataParallel) {
  LOOM_NEEDS_GPU();
  for (const bool fused : {false, true}) {
    const char* epilogues = fused ? "cuBLASLt epilogues" : "Loom's epilogues";
    const ReplicaRun dp = run_replicas(0, fused, 1), z1 = run_replicas(1, fused, 1), z2 = run_replicas(2, fused, 1);
    for (const ReplicaRun* z : {&z1, &z2}) {
      const char* stage = z == &z1 ? "ZeRO 1" : "ZeRO 2";
      EXPECT_TRUE(z->weights[0] == z->weights[1]) << stage << ": the ranks' weights differ, " << epilogues;
      EXPECT_TRUE(z->weights[0] == dp.weights[0]) << stage << " against data parallel, " << epilogues;
      const int64_t numel = static_cast<int64_t>(dp.weights[0].size());
      for (int r = 0; r < 2; ++r) {
        const auto [lo, hi] = zero_shard(numel, r, 2);
        for (int64_t i = 0; i < numel; ++i) {
          const float want = i >= lo && i < hi ? dp.exp_avg[0][size_t(i)] : 0.0f;
          ASSERT_EQ(z->exp_avg[size_t(r)][size_t(i)], want) << stage << ", rank " << r << "'s exp_avg at " << i;
        }
      }
    }
  }
}

// Two ranks (threads) sharing the GPU, three steps, twice: the same bits. Each trainer has
// its own stream; cuBLAS promises the same bits with several streams active only where
// each handle has a workspace of its own (cuBLAS's "Results reproducibility"), which the
// trainer's handle did not have when two runs of this job on the H200 ended 5.6e-3 to
// 6.0e-3 of the largest weight apart (docs/gpu.md, "Determinism"). Data parallel and ZeRO
// 2 (a reduce-scatter, then each rank's shard), with either epilogues.
TEST(GpuGpt, TwoRanksSharingTheGpuRepeatTheirBits) {
  LOOM_NEEDS_GPU();
  const nn::Gpt layout({.n_layer = 2, .n_head = 3, .d_model = 96, .seq_len = 64, .vocab_size = 301});
  const auto name_of = [&](size_t i) {
    for (const ParamInfo& p : layout.params().infos())
      if (i >= size_t(p.offset) && i < size_t(p.offset + p.numel)) return p.name;
    return std::string("?");
  };
  for (const int zero : {0, 2})
    for (const bool fused : {false, true}) {
      const ReplicaRun a = run_replicas(zero, fused, 3), b = run_replicas(zero, fused, 3);
      for (int r = 0; r < 2; ++r)
        for (const auto& [what, x, y] : {std::tuple{"weights", &a.weights[size_t(r)], &b.weights[size_t(r)]},
                                        std::tuple{"exp_avg", &a.exp_avg[size_t(r)], &b.exp_avg[size_t(r)]}}) {
          ASSERT_EQ(x->size(), y->size());
          const auto diff = std::mismatch(x->begin(), x->end(), y->begin());
          EXPECT_TRUE(diff.first == x->end())
              << "ZeRO " << zero << (fused ? ", cuBLASLt epilogues" : ", Loom's epilogues") << ", rank " << r << ": the "
              << what << " of two runs first differ at element " << diff.first - x->begin() << " (of "
              << name_of(size_t(diff.first - x->begin())) << ")";
        }
    }
}

}  // namespace
}  // namespace loom::gpu
