// The GPT trainer on one GPU (loom/gpu/gpu.h): the CPU model's step (nn::Gpt under bf16
// mixed precision, docs/numerics.md) with cuBLAS products and Loom's kernels.
//
// Row-major tensors meet column-major cuBLAS as their transposes: a row-major (N, M)
// matrix is a column-major (M, N) one with the same leading dimension, so out = x @ w
// (x (N, K), w (K, M), Hugging Face's layout) is cuBLAS's out^T = w^T x^T with neither
// operand transposed, m = M, n = N, k = K.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/cublas.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/lt_products.h"
#include "gpu/nccl/nccl.h"
#include "loom/comm/comm.h"
#include "loom/core/error.h"
#include "loom/gpu/gpu.h"

namespace loom::gpu {
namespace {

using kern::bf16;

struct LinearOffsets {
  int64_t weight = 0, bias = 0;
};
struct NormOffsets {
  int64_t weight = 0, bias = 0;
};
struct BlockOffsets {
  NormOffsets ln_1, ln_2;
  LinearOffsets c_attn, attn_proj, c_fc, mlp_proj;
};

// A LayerNorm's output (N, C) bf16, and the mean and rstd (N) f32 its backward needs.
struct Normed {
  DeviceBuffer out, mean, rstd;
};

// What one micro-batch's forward keeps for its backward, per block.
struct BlockActs {
  DeviceBuffer x;         // (N, C) the block's input
  Normed ln_1;
  DeviceBuffer qkv;       // (N, 3C)
  DeviceBuffer att, lse;  // (N, C), (B, NH, T) f32
  DeviceBuffer mid;       // (N, C) x + attention
  Normed ln_2;
  DeviceBuffer h, g;      // (N, 4C) before and after GELU
};

}  // namespace

struct GptTrainer::Impl {
  nn::GptConfig cfg;
  GptTrainerConfig tc;
  int64_t b = 0, t = 0, n = 0, c = 0, nh = 0, v = 0, ldv = 0, numel = 0;
  int64_t max_b = 0;  // micro_batch: what the token buffers hold; b and n are the call's
  int64_t wte = 0, wpe = 0;
  NormOffsets ln_f;
  std::vector<BlockOffsets> blocks;
  std::vector<kern::AdamChunk> chunks;
  int64_t steps = 0;
  int64_t shard_begin = 0, shard_end = 0;  // what step() updates: all, or a ZeRO shard

  DeviceAllocator alloc;
  std::unique_ptr<LtProducts> lt;  // the fused epilogues (tc.fused_epilogues); after alloc, which it uses
  Stream compute, copy;
  PhaseTimer timer{false};
  cublasHandle_t blas = nullptr;
  // cuBLAS's workspace for `blas`, owned here. Without one, cuBLAS takes workspace from a
  // pool of its own and promises the same bits only while a single stream is active in the
  // process: two trainers (ranks as threads sharing a GPU) each with its own stream may get
  // other kernels run to run (cuBLAS's "Results reproducibility"; docs/gpu.md, "Determinism").
  DeviceBuffer blas_workspace;
  DeviceBuffer params, grads, exp_avg, exp_avg_sq, params_bf16, chunk_table, reduce_scratch, results;
  DeviceBuffer wte_padded;  // (ldv, C) bf16: wte's rows, then zeros, for the head's aligned products
  DeviceBuffer tokens, targets, wte_rows, wte_starts, wte_ids;
  PinnedBuffer host_ids, host_csr, host_results;
  // Data parallelism's staging, made at first use: the gradients (numel floats, padded to
  // ZeRO's blocks), a reduce-scatter's shard, the gathered weights.
  PinnedBuffer host_grads, host_shard, host_params;
  std::unique_ptr<NcclGroup> nccl;  // made at the first all_reduce_grads_nccl

  int64_t shard_size() const { return (numel + tc.zero_ranks - 1) / tc.zero_ranks; }  // ZeRO's block
  int64_t padded() const { return shard_size() * tc.zero_ranks; }
  void stage(PinnedBuffer& b, int64_t floats) {
    if (b.as<void>() == nullptr) b = PinnedBuffer(static_cast<size_t>(floats) * 4);
  }

  ~Impl() {
    if (blas != nullptr) cublas().destroy(blas);
  }

  float* p32(int64_t off) const { return params.as<float>() + off; }
  float* g32(int64_t off) const { return grads.as<float>() + off; }
  const bf16* p16(int64_t off) const { return params_bf16.as<bf16>() + off; }
  cudaStream_t s() const { return compute.get(); }
  void mark(const char* phase) { timer.mark(phase, s()); }
  DeviceBuffer buf(int64_t elements, size_t elem_bytes, const char* what) {
    return DeviceBuffer(alloc, static_cast<size_t>(elements) * elem_bytes, what);
  }

  // out (m x n, column-major, ldc) = op(a) op(b) (+ out when accumulate); a, b bf16.
  void gemm(bool ta, bool tb, int64_t m, int64_t nn, int64_t k, const bf16* a, int64_t lda, const bf16* bm,
            int64_t ldb, void* out, bool out_f32, int64_t ldc, bool accumulate) const {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    check(cublas().gemm_ex(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, int(m), int(nn), int(k),
                       &alpha, a, CUDA_R_16BF, int(lda), bm, CUDA_R_16BF, int(ldb), &beta, out,
                       out_f32 ? CUDA_R_32F : CUDA_R_16BF, int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  // out (N, M) bf16 = x (N, K) @ w (K, M) + bias, then by `e`: + residual (N, M)
  // (kBiasResidual), or GELU with its input to pre (kBiasGelu). On cuBLASLt where it has
  // a kernel for it; otherwise the product to acc (N, 4C) f32, made at its first use, and
  // the epilogue's kernel.
  void linear(Epilogue e, bf16* out, const bf16* x, const LinearOffsets& w, int64_t k, int64_t m, DeviceBuffer& acc,
              const bf16* residual = nullptr, bf16* pre = nullptr) {
    mark("linear forward");
    if (lt && lt->run({.epilogue = e, .m = m, .n = n, .k = k, .a = p16(w.weight), .lda = m, .b = x, .ldb = k,
                       .d = out, .ldd = m, .bias = p32(w.bias), .bias_bf16 = p16(w.bias),
                       .residual = residual, .aux = pre}))
      return;
    if (acc.as<void>() == nullptr) acc = buf(n * 4 * c, 4, "product accumulator (N, 4C)");
    gemm(false, false, m, n, k, p16(w.weight), m, x, k, acc.as<float>(), true, m, false);
    mark("bias, residual, GELU");
    if (e == Epilogue::kBiasResidual)
      kern::bias_residual_forward(out, acc.as<float>(), p32(w.bias), residual, n, m, s());
    else if (e == Epilogue::kBiasGelu)
      kern::bias_gelu_forward(pre, out, acc.as<float>(), p32(w.bias), n, m, s());
    else
      kern::bias_forward(out, acc.as<float>(), p32(w.bias), n, m, s());
  }
  // dx (N, K) bf16 = dy (N, M) @ w^T, times gelu'(gelu_pre) where the layer's input was a
  // GELU of gelu_pre (N, K); dw (K, M) += x^T @ dy; db (M) += column sums of dy.
  void linear_backward(bf16* dx, const bf16* dy, const bf16* x, const LinearOffsets& w, int64_t k, int64_t m,
                       float* parts, const bf16* gelu_pre = nullptr) {
    mark("linear backward dx");
    const bool gelu_fused = gelu_pre != nullptr && lt &&
                            lt->run({.epilogue = Epilogue::kGeluGrad, .ta = true, .m = k, .n = n, .k = m,
                                     .a = p16(w.weight), .lda = m, .b = dy, .ldb = m, .d = dx, .ldd = k,
                                     .aux = const_cast<bf16*>(gelu_pre)});
    if (!gelu_fused) gemm(true, false, k, n, m, p16(w.weight), m, dy, m, dx, false, k, false);
    if (gelu_pre != nullptr && !gelu_fused) {
      mark("GELU backward");
      kern::gelu_backward(dx, gelu_pre, dx, n * k, s());
    }
    mark("linear backward dw");
    if (lt && lt->run({.epilogue = Epilogue::kBiasGrad, .tb = true, .m = m, .n = k, .k = n, .a = dy, .lda = m,
                       .b = x, .ldb = k, .d = g32(w.weight), .ldd = m, .bias_grad = parts})) {
      kern::add(g32(w.bias), parts, m, s());
      return;
    }
    gemm(false, true, m, k, n, dy, m, x, k, g32(w.weight), true, m, true);
    mark("bias gradients");
    kern::column_sums(parts, dy, n, m, s());
    kern::add_partials(g32(w.bias), parts, kern::column_sum_parts(n), m, s());
  }
  Normed norm_forward(const DeviceBuffer& x, const NormOffsets& w) {
    Normed y{buf(n * c, 2, "LayerNorm output"), buf(n, 4, "LayerNorm mean"), buf(n, 4, "LayerNorm rstd")};
    mark("layernorm");
    kern::layernorm_forward(y.out.as<bf16>(), y.mean.as<float>(), y.rstd.as<float>(), x.as<bf16>(), p32(w.weight),
                            p32(w.bias), n, c, s());
    return y;
  }
  // dx = LayerNorm'(x)^T dy + dres (dres may be null); the weight and bias gradients added.
  void norm_backward(bf16* dx, const bf16* dy, const bf16* x, const Normed& y, const NormOffsets& w, const bf16* dres,
                     float* parts) {
    mark("layernorm backward");
    const int64_t p = kern::layernorm_partials(n);
    kern::layernorm_backward(dx, parts, parts + p * c, dy, x, y.mean.as<float>(), y.rstd.as<float>(), p32(w.weight),
                             dres, n, c, s());
    kern::add_partials(g32(w.weight), parts, p, c, s());
    kern::add_partials(g32(w.bias), parts + p * c, p, c, s());
  }

  kern::AttentionKernels attention() const {
    switch (tc.attention) {
      case GpuAttention::kWmma:
        return kern::AttentionKernels::kWmma;
      case GpuAttention::kMmaX4:
        return kern::AttentionKernels::kMmaX4;
      default:
        return kern::AttentionKernels::kMma;
    }
  }

  static std::unique_ptr<Impl> open(const nn::Gpt& model, const GptTrainerConfig& config);
  double forward_backward(std::span<const int32_t> tok, std::span<const int32_t> tgt, double scale, bool backward);
  // wte_padded's first V rows from the bf16 parameters (after every update).
  void refresh_head() const {
    check(cudaMemcpyAsync(wte_padded.as<void>(), p16(wte), size_t(v * c) * 2, cudaMemcpyDeviceToDevice, s()),
          "cudaMemcpyAsync");
  }
  // Returns how many distinct token ids the batch holds.
  int64_t upload_batch(std::span<const int32_t> tok, std::span<const int32_t> tgt);
};

namespace {

int64_t offset_of(const ParamSet& ps, const std::string& name) {
  const int i = ps.find(name);
  LOOM_CHECK(i >= 0);
  return ps.infos()[static_cast<size_t>(i)].offset;
}

LinearOffsets linear_at(const ParamSet& ps, const std::string& prefix) {
  return {offset_of(ps, prefix + ".weight"), offset_of(ps, prefix + ".bias")};
}

NormOffsets norm_at(const ParamSet& ps, const std::string& prefix) {
  return {offset_of(ps, prefix + ".weight"), offset_of(ps, prefix + ".bias")};
}

}  // namespace

// Checks what the GPU kernels take, then selects the device, before Impl's streams and
// handles are made on it.
std::unique_ptr<GptTrainer::Impl> GptTrainer::Impl::open(const nn::Gpt& model, const GptTrainerConfig& config) {
  const nn::GptConfig& g = model.config();
  LOOM_CHECK(model.params().dtype() == DType::kF32 && model.part().all_blocks && model.part().embeddings &&
             model.part().head);
  if (config.optimizer.kind != "adamw")
    throw InputError(cat("optimizer.kind = \"", config.optimizer.kind, "\": the GPU trainer runs adamw only"));
  if (!kern::attention_head_size_supported(g.d_model / g.n_head))
    throw InputError(cat("model: head size d_model / n_head = ", g.d_model / g.n_head,
                         ": the GPU attention takes head sizes 32 and 64"));
  if (g.d_model > 4096) throw InputError(cat("model.d_model = ", g.d_model, ": the GPU LayerNorm takes at most 4096"));
  require_device(config.device);
  check(cudaSetDevice(config.device), "cudaSetDevice");
  return std::make_unique<GptTrainer::Impl>();
}

GptTrainer::GptTrainer(const nn::Gpt& model, const GptTrainerConfig& config) : impl_(Impl::open(model, config)) {
  Impl& m = *impl_;
  const nn::GptConfig& g = model.config();
  const ParamSet& ps = model.params();
  m.cfg = g;
  m.tc = config;
  m.timer.enable(config.profile);
  m.b = m.max_b = config.micro_batch;
  m.t = config.seq_len > 0 ? config.seq_len : g.seq_len;
  LOOM_CHECK(m.b >= 1 && m.t >= 1 && m.t <= g.seq_len);
  m.n = m.b * m.t;
  m.c = g.d_model;
  m.nh = g.n_head;
  m.v = g.vocab_size;
  m.ldv = (m.v + 63) / 64 * 64;  // logits rows aligned for the tensor cores
  m.numel = ps.numel();
  m.wte = offset_of(ps, "transformer.wte.weight");
  m.wpe = offset_of(ps, "transformer.wpe.weight");
  m.ln_f = norm_at(ps, "transformer.ln_f");
  for (int64_t l = 0; l < g.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l);
    m.blocks.push_back({norm_at(ps, p + ".ln_1"), norm_at(ps, p + ".ln_2"), linear_at(ps, p + ".attn.c_attn"),
                        linear_at(ps, p + ".attn.c_proj"), linear_at(ps, p + ".mlp.c_fc"),
                        linear_at(ps, p + ".mlp.c_proj")});
  }
  LOOM_CHECK(config.zero_ranks >= 1 && config.zero_rank >= 0 && config.zero_rank < config.zero_ranks);
  std::tie(m.shard_begin, m.shard_end) =
      config.zero_ranks > 1 ? zero_shard(m.numel, config.zero_rank, config.zero_ranks) : std::pair{int64_t{0}, m.numel};
  const optim::DecayPolicy& decay = config.optimizer.decay;
  for (const ParamInfo& info : ps.infos()) {  // AdamW's chunks within the shard
    const int64_t lo = std::max(info.offset, m.shard_begin), hi = std::min(info.offset + info.numel, m.shard_end);
    for (int64_t i = lo; i < hi; i += kern::kAdamChunk)
      m.chunks.push_back({i, static_cast<int32_t>(std::min<int64_t>(kern::kAdamChunk, hi - i)),
                          decay.decays(info.kind) ? 1 : 0});
  }

  check(cublas().create(&m.blas), "cublasCreate");
  check(cublas().set_stream(m.blas, m.s()), "cublasSetStream");
  m.blas_workspace = m.buf(LtProducts::kWorkspaceBytes, 1, "cuBLAS workspace");  // the size cuBLASLt's gets
  check(cublas().set_workspace(m.blas, m.blas_workspace.as<void>(), m.blas_workspace.bytes()), "cublasSetWorkspace");
  if (config.fused_epilogues) m.lt = std::make_unique<LtProducts>(m.alloc, m.s());
  m.params = m.buf(m.numel, 4, "parameters");
  m.grads = m.buf(m.numel, 4, "gradients");
  m.exp_avg = m.buf(m.shard_end - m.shard_begin, 4, "AdamW exp_avg");
  m.exp_avg_sq = m.buf(m.shard_end - m.shard_begin, 4, "AdamW exp_avg_sq");
  m.params_bf16 = m.buf(m.numel, 2, "bf16 parameters");
  m.wte_padded = m.buf(m.ldv * m.c, 2, "padded bf16 wte");
  check(cudaMemsetAsync(m.wte_padded.as<void>(), 0, m.wte_padded.bytes(), m.s()), "cudaMemsetAsync");
  m.chunk_table = m.buf(std::max<int64_t>(1, static_cast<int64_t>(m.chunks.size())), sizeof(kern::AdamChunk),
                        "AdamW chunks");
  m.reduce_scratch = m.buf(kern::kReduceBlocks, 8, "reduction scratch");
  m.results = m.buf(2, 8, "results");
  m.tokens = m.buf(m.n, 4, "tokens");
  m.targets = m.buf(m.n, 4, "targets");
  m.wte_rows = m.buf(m.n, 4, "token rows");
  m.wte_starts = m.buf(m.n + 1, 4, "token row starts");
  m.wte_ids = m.buf(m.n, 4, "token ids");
  m.host_ids = PinnedBuffer(static_cast<size_t>(2 * m.n) * 4);
  m.host_csr = PinnedBuffer(static_cast<size_t>(3 * m.n + 1) * 4);
  m.host_results = PinnedBuffer(8);
  check(cudaMemcpyAsync(m.chunk_table.as<void>(), m.chunks.data(), m.chunks.size() * sizeof(kern::AdamChunk),
                        cudaMemcpyHostToDevice, m.s()),
        "cudaMemcpyAsync");
  check(cudaMemsetAsync(m.grads.as<void>(), 0, m.grads.bytes(), m.s()), "cudaMemsetAsync");
  check(cudaMemsetAsync(m.exp_avg.as<void>(), 0, m.exp_avg.bytes(), m.s()), "cudaMemsetAsync");
  check(cudaMemsetAsync(m.exp_avg_sq.as<void>(), 0, m.exp_avg_sq.bytes(), m.s()), "cudaMemsetAsync");
  copy_params_from(ps);
}

GptTrainer::~GptTrainer() = default;

// Tokens and targets to the device on the copy stream (through pinned memory), with the
// rows of each distinct token id for the embedding's backward (sorted on the host, so that
// the device adds each id's rows in one block, in order, without atomics).
int64_t GptTrainer::Impl::upload_batch(std::span<const int32_t> tok, std::span<const int32_t> tgt) {
  LOOM_CHECK_EQ(tok.size(), tgt.size());
  LOOM_CHECK(tok.size() % size_t(t) == 0 && tok.size() > 0 && int64_t(tok.size()) <= max_b * t);
  b = int64_t(tok.size()) / t;
  n = b * t;
  int32_t* ids = host_ids.as<int32_t>();
  std::copy(tok.begin(), tok.end(), ids);
  std::copy(tgt.begin(), tgt.end(), ids + n);
  int32_t* rows = host_csr.as<int32_t>();
  int32_t* starts = rows + n;
  int32_t* distinct = starts + n + 1;
  std::iota(rows, rows + n, 0);
  std::stable_sort(rows, rows + n, [&](int32_t a, int32_t bb) { return tok[size_t(a)] < tok[size_t(bb)]; });
  int64_t n_ids = 0;
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || tok[size_t(rows[i])] != tok[size_t(rows[i - 1])]) {
      starts[n_ids] = static_cast<int32_t>(i);
      distinct[n_ids++] = tok[size_t(rows[i])];
    }
  starts[n_ids] = static_cast<int32_t>(n);
  cudaStream_t cs = copy.get();
  check(cudaMemcpyAsync(tokens.as<void>(), ids, size_t(n) * 4, cudaMemcpyHostToDevice, cs), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(targets.as<void>(), ids + n, size_t(n) * 4, cudaMemcpyHostToDevice, cs), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(wte_rows.as<void>(), rows, size_t(n) * 4, cudaMemcpyHostToDevice, cs), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(wte_starts.as<void>(), starts, size_t(n_ids + 1) * 4, cudaMemcpyHostToDevice, cs),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(wte_ids.as<void>(), distinct, size_t(n_ids) * 4, cudaMemcpyHostToDevice, cs),
        "cudaMemcpyAsync");
  copy.signal(compute);
  return n_ids;
}

double GptTrainer::Impl::forward_backward(std::span<const int32_t> tok, std::span<const int32_t> tgt, double scale,
                                          bool backward) {
  const int64_t n_ids = upload_batch(tok, tgt);
  const int64_t n_layer = cfg.n_layer, c3 = 3 * c, c4 = 4 * c;
  std::vector<BlockActs> acts(static_cast<size_t>(n_layer));
  DeviceBuffer acc;  // the products' f32 results where an epilogue runs apart (linear)
  DeviceBuffer x = buf(n * c, 2, "embedding output");
  mark("embedding");
  kern::embedding_forward(x.as<bf16>(), tokens.as<int32_t>(), p32(wte), p32(wpe), n, t, c, s());
  for (int64_t l = 0; l < n_layer; ++l) {
    BlockActs& a = acts[size_t(l)];
    const BlockOffsets& w = blocks[size_t(l)];
    a.x = std::move(x);
    a.ln_1 = norm_forward(a.x, w.ln_1);
    a.qkv = buf(n * c3, 2, "qkv");
    linear(Epilogue::kBias, a.qkv.as<bf16>(), a.ln_1.out.as<bf16>(), w.c_attn, c, c3, acc);
    a.att = buf(n * c, 2, "attention output");
    a.lse = buf(n * nh, 4, "attention log-sum-exp");
    mark("attention forward");
    kern::attention_forward(a.att.as<bf16>(), a.lse.as<float>(), a.qkv.as<bf16>(), b, t, c, nh, s(), attention());
    a.mid = buf(n * c, 2, "residual after attention");
    linear(Epilogue::kBiasResidual, a.mid.as<bf16>(), a.att.as<bf16>(), w.attn_proj, c, c, acc,
           a.x.as<bf16>());
    a.ln_2 = norm_forward(a.mid, w.ln_2);
    a.h = buf(n * c4, 2, "fc output");
    a.g = buf(n * c4, 2, "GELU output");
    linear(Epilogue::kBiasGelu, a.g.as<bf16>(), a.ln_2.out.as<bf16>(), w.c_fc, c, c4, acc, nullptr,
           a.h.as<bf16>());
    x = buf(n * c, 2, "block output");
    linear(Epilogue::kBiasResidual, x.as<bf16>(), a.g.as<bf16>(), w.mlp_proj, c4, c, acc,
           a.mid.as<bf16>());
  }
  acc.reset();
  // ln_f, the tied head, the loss and its gradient (over the logits, in place)
  Normed lnf = norm_forward(x, ln_f);
  DeviceBuffer logits = buf(n * ldv, 2, "logits (N, V)");
  mark("head forward");
  // V rounded up to ldv (zero rows of wte_padded): products with every dimension a multiple
  // of 64, which cuBLAS runs 3-4x faster than with GPT-2's odd 50257
  gemm(true, false, ldv, n, c, wte_padded.as<bf16>(), c, lnf.out.as<bf16>(), c, logits.as<bf16>(), false, ldv, false);
  DeviceBuffer losses = buf(n, 4, "losses");
  mark("cross-entropy");
  kern::cross_entropy(losses.as<float>(), logits.as<bf16>(), targets.as<int32_t>(), n, v, ldv,
                      static_cast<float>(scale / static_cast<double>(n)), s());
  kern::reduce_sum(results.as<double>(), losses.as<float>(), n, false, reduce_scratch.as<double>(), s());
  check(cudaMemcpyAsync(host_results.as<double>(), results.as<double>(), 8, cudaMemcpyDeviceToHost, s()),
        "cudaMemcpyAsync");
  losses.reset();
  // The mean loss, once the queued work is done (and the phases timed).
  const auto finish = [&] {
    mark("end");
    compute.synchronize();
    timer.collect();
    return host_results.as<double>()[0] / static_cast<double>(n);
  };
  if (!backward) return finish();

  const int64_t parts_rows = std::max(kern::column_sum_parts(n), 2 * kern::layernorm_partials(n));
  DeviceBuffer parts = buf(parts_rows * c4, 4, "partial sums");
  DeviceBuffer dlnf = buf(n * c, 2, "ln_f gradient");
  mark("head backward");
  gemm(false, false, c, n, ldv, wte_padded.as<bf16>(), c, logits.as<bf16>(), ldv, dlnf.as<bf16>(), false, c, false);
  {
    DeviceBuffer dwte = buf(ldv * c, 4, "head weight gradient (ldv, C)");
    gemm(false, true, c, ldv, n, lnf.out.as<bf16>(), c, logits.as<bf16>(), ldv, dwte.as<float>(), true, c, false);
    kern::add(g32(wte), dwte.as<float>(), v * c, s());
  }
  logits.reset();
  DeviceBuffer dx = buf(n * c, 2, "residual gradient");
  norm_backward(dx.as<bf16>(), dlnf.as<bf16>(), x.as<bf16>(), lnf, ln_f, nullptr, parts.as<float>());
  lnf = Normed{};
  x.reset();
  DeviceBuffer dwide = buf(n * c4, 2, "gradient (N, 4C)");
  DeviceBuffer dnarrow = buf(n * c, 2, "gradient (N, C)");
  DeviceBuffer dmid = buf(n * c, 2, "residual gradient after attention");
  DeviceBuffer dpre = buf(n * nh, 4, "attention dpre");
  for (int64_t l = n_layer - 1; l >= 0; --l) {
    BlockActs& a = acts[size_t(l)];
    const BlockOffsets& w = blocks[size_t(l)];
    // MLP: dx is the gradient of the block's output
    linear_backward(dwide.as<bf16>(), dx.as<bf16>(), a.g.as<bf16>(), w.mlp_proj, c4, c, parts.as<float>(),
                    a.h.as<bf16>());
    linear_backward(dnarrow.as<bf16>(), dwide.as<bf16>(), a.ln_2.out.as<bf16>(), w.c_fc, c, c4, parts.as<float>());
    norm_backward(dmid.as<bf16>(), dnarrow.as<bf16>(), a.mid.as<bf16>(), a.ln_2, w.ln_2, dx.as<bf16>(),
                  parts.as<float>());
    // attention: dmid is the gradient of x + attention
    linear_backward(dnarrow.as<bf16>(), dmid.as<bf16>(), a.att.as<bf16>(), w.attn_proj, c, c, parts.as<float>());
    mark("attention backward");
    kern::attention_backward(dwide.as<bf16>(), dpre.as<float>(), dnarrow.as<bf16>(), a.qkv.as<bf16>(),
                             a.att.as<bf16>(), a.lse.as<float>(), b, t, c, nh, s(), attention());
    linear_backward(dnarrow.as<bf16>(), dwide.as<bf16>(), a.ln_1.out.as<bf16>(), w.c_attn, c, c3, parts.as<float>());
    norm_backward(dx.as<bf16>(), dnarrow.as<bf16>(), a.x.as<bf16>(), a.ln_1, w.ln_1, dmid.as<bf16>(),
                  parts.as<float>());
    a = BlockActs{};
  }
  mark("embedding backward");
  kern::wpe_backward(g32(wpe), dx.as<bf16>(), b, t, c, s());
  kern::wte_backward(g32(wte), dx.as<bf16>(), wte_rows.as<int32_t>(), wte_starts.as<int32_t>(), wte_ids.as<int32_t>(),
                     n_ids, c, s());
  return finish();
}

double GptTrainer::forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets, double scale) {
  return impl_->forward_backward(tokens, targets, scale, true);
}

double GptTrainer::loss(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  return impl_->forward_backward(tokens, targets, 0.0, false);
}

std::pair<int64_t, int64_t> zero_shard(int64_t numel, int rank, int ranks) {
  const int64_t s = (numel + ranks - 1) / ranks;
  return {std::min(numel, rank * s), std::min(numel, (rank + 1) * s)};
}

parallel::CommStats GptTrainer::all_reduce_grads(comm::Communicator& comm) {
  Impl& m = *impl_;
  parallel::CommStats stats;
  if (comm.size() == 1) return stats;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  m.stage(m.host_grads, m.padded());
  float* host = m.host_grads.as<float>();
  float* dev = m.grads.as<float>();
  m.mark("gradient all-reduce");
  check(cudaMemcpyAsync(host, dev, size_t(m.numel) * 4, cudaMemcpyDeviceToHost, m.s()), "cudaMemcpyAsync");
  m.compute.synchronize();
  constexpr int64_t kChunk = int64_t{4} << 20;  // floats
  std::vector<std::pair<int64_t, comm::Work>> chunks;
  for (int64_t first = 0; first < m.numel; first += kChunk) {
    const int64_t count = std::min(kChunk, m.numel - first);
    chunks.emplace_back(first, comm::all_reduce_async(comm, {.output = host + first, .count = size_t(count)}));
    stats.bytes += count * 4;
  }
  for (auto& [first, work] : chunks) {
    work.wait();
    const int64_t count = std::min(kChunk, m.numel - first);
    check(cudaMemcpyAsync(dev + first, host + first, size_t(count) * 4, cudaMemcpyHostToDevice, m.s()),
          "cudaMemcpyAsync");
  }
  stats.comm_ms = stats.exposed_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  return stats;
}

parallel::CommStats GptTrainer::all_reduce_grads_nccl(comm::Communicator& comm) {
  Impl& m = *impl_;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (m.nccl == nullptr) m.nccl = NcclGroup::create(comm);
  m.mark("gradient all-reduce");
  m.nccl->all_reduce(m.grads.as<float>(), m.numel, m.s());
  m.compute.synchronize();  // the time is the exchange's, as the other paths report it
  const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  return {.comm_ms = ms, .exposed_ms = ms, .bytes = m.numel * 4};
}

parallel::CommStats GptTrainer::reduce_scatter_grads(comm::Communicator& comm) {
  Impl& m = *impl_;
  LOOM_CHECK_EQ(comm.size(), m.tc.zero_ranks);
  LOOM_CHECK_EQ(comm.rank(), m.tc.zero_rank);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  m.stage(m.host_grads, m.padded());
  m.stage(m.host_shard, m.shard_size());
  float* host = m.host_grads.as<float>();
  m.mark("gradient reduce-scatter");
  check(cudaMemcpyAsync(host, m.grads.as<void>(), size_t(m.numel) * 4, cudaMemcpyDeviceToHost, m.s()),
        "cudaMemcpyAsync");
  m.compute.synchronize();
  std::fill(host + m.numel, host + m.padded(), 0.0f);
  comm::reduce_scatter(comm, {.input = host, .output = m.host_shard.as<float>(), .count = size_t(m.shard_size())});
  check(cudaMemcpyAsync(m.g32(m.shard_begin), m.host_shard.as<float>(), size_t(m.shard_end - m.shard_begin) * 4,
                        cudaMemcpyHostToDevice, m.s()),
        "cudaMemcpyAsync");
  const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  return {.comm_ms = ms, .exposed_ms = ms, .bytes = m.padded() * 4};
}

double GptTrainer::step(double lr, comm::Communicator* zero, parallel::CommStats* stats) {
  Impl& m = *impl_;
  const bool sharded = m.tc.zero_ranks > 1;
  LOOM_CHECK(!sharded || (zero != nullptr && zero->size() == m.tc.zero_ranks && zero->rank() == m.tc.zero_rank));
  m.mark("gradient norm");
  kern::reduce_sum(m.results.as<double>(), m.g32(m.shard_begin), m.shard_end - m.shard_begin, true,
                   m.reduce_scratch.as<double>(), m.s());
  check(cudaMemcpyAsync(m.host_results.as<double>(), m.results.as<double>(), 8, cudaMemcpyDeviceToHost, m.s()),
        "cudaMemcpyAsync");
  m.compute.synchronize();
  double squares = m.host_results.as<double>()[0];
  if (sharded) comm::all_reduce(*zero, {.output = &squares, .count = 1, .dtype = DType::kF64});
  const double norm = std::sqrt(squares);
  if (!std::isfinite(norm)) return norm;  // nothing updated: the caller stops the run
  const double max_norm = m.tc.max_grad_norm;
  const double clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  ++m.steps;
  const optim::OptimizerConfig& o = m.tc.optimizer;
  const kern::AdamArgs args{.lr = float(lr),
                            .beta1 = float(o.beta1),
                            .beta2 = float(o.beta2),
                            .eps = float(o.eps),
                            .weight_decay = float(o.weight_decay),
                            .bias1 = float(1.0 - std::pow(o.beta1, double(m.steps))),
                            .bias2_sqrt = float(std::sqrt(1.0 - std::pow(o.beta2, double(m.steps)))),
                            .grad_scale = float(clip),
                            .state_offset = m.shard_begin};
  m.mark("AdamW");
  kern::adamw(m.params.as<float>(), m.grads.as<float>(), m.exp_avg.as<float>(), m.exp_avg_sq.as<float>(),
              m.params_bf16.as<bf16>(), m.chunk_table.as<kern::AdamChunk>(), int64_t(m.chunks.size()), args, m.s());
  if (sharded) {  // every shard's new weights to every rank, through pinned memory
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    m.mark("weight all-gather");
    m.stage(m.host_params, m.padded());
    float* host = m.host_params.as<float>();
    const int64_t mine = m.tc.zero_rank * m.shard_size();
    check(cudaMemcpyAsync(host + mine, m.p32(m.shard_begin), size_t(m.shard_end - m.shard_begin) * 4,
                          cudaMemcpyDeviceToHost, m.s()),
          "cudaMemcpyAsync");
    m.compute.synchronize();
    comm::all_gather(*zero, {.output = host, .count = size_t(m.shard_size())});
    check(cudaMemcpyAsync(m.params.as<void>(), host, size_t(m.numel) * 4, cudaMemcpyHostToDevice, m.s()),
          "cudaMemcpyAsync");
    kern::cast_to_bf16(m.params_bf16.as<bf16>(), m.params.as<float>(), m.numel, m.s());
    if (stats != nullptr) {
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      stats->comm_ms += ms;
      stats->exposed_ms += ms;
      stats->bytes += m.padded() * 4;
    }
  }
  m.refresh_head();
  check(cudaMemsetAsync(m.grads.as<void>(), 0, m.grads.bytes(), m.s()), "cudaMemsetAsync");
  m.mark("end");
  if (m.tc.profile) {
    m.compute.synchronize();
    m.timer.collect();
  }
  return norm;
}

int64_t GptTrainer::steps() const { return impl_->steps; }

namespace {

void to_host(void* dst, const DeviceBuffer& src, size_t bytes, cudaStream_t s) {
  check(cudaMemcpyAsync(dst, src.as<void>(), bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace

void GptTrainer::copy_params_to(const ParamSet& params) const {
  LOOM_CHECK_EQ(params.numel(), impl_->numel);
  to_host(params.values().data<float>(), impl_->params, size_t(impl_->numel) * 4, impl_->s());
}

void GptTrainer::copy_grads_to(const ParamSet& params) const {
  LOOM_CHECK_EQ(params.numel(), impl_->numel);
  to_host(params.grads().data<float>(), impl_->grads, size_t(impl_->numel) * 4, impl_->s());
}

void GptTrainer::copy_moments_to(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  const Impl& m = *impl_;
  LOOM_CHECK_EQ(exp_avg.numel(), m.numel);
  LOOM_CHECK_EQ(exp_avg_sq.numel(), m.numel);
  const size_t bytes = size_t(m.shard_end - m.shard_begin) * 4;
  to_host(exp_avg.data<float>() + m.shard_begin, m.exp_avg, bytes, m.s());
  to_host(exp_avg_sq.data<float>() + m.shard_begin, m.exp_avg_sq, bytes, m.s());
}

void GptTrainer::copy_moments_from(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t steps) {
  Impl& m = *impl_;
  LOOM_CHECK_EQ(exp_avg.numel(), m.numel);
  LOOM_CHECK_EQ(exp_avg_sq.numel(), m.numel);
  m.compute.synchronize();
  const size_t bytes = size_t(m.shard_end - m.shard_begin) * 4;
  check(cudaMemcpy(m.exp_avg.as<void>(), exp_avg.data<float>() + m.shard_begin, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaMemcpy(m.exp_avg_sq.as<void>(), exp_avg_sq.data<float>() + m.shard_begin, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  m.steps = steps;
}

void GptTrainer::copy_params_from(const ParamSet& params) {
  Impl& m = *impl_;
  LOOM_CHECK_EQ(params.numel(), m.numel);
  m.compute.synchronize();  // no queued update still writes the parameters
  check(cudaMemcpy(m.params.as<void>(), params.values().data<float>(), size_t(m.numel) * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  kern::cast_to_bf16(m.params_bf16.as<bf16>(), m.params.as<float>(), m.numel, m.s());
  m.refresh_head();
  m.compute.synchronize();
}

std::vector<std::pair<std::string, double>> GptTrainer::phase_ms() { return impl_->timer.take(); }

std::string GptTrainer::epilogues() const {
  return impl_->lt ? "cuBLASLt: " + impl_->lt->summary() : "Loom's kernels after each product";
}

MemoryStats GptTrainer::memory() const { return impl_->alloc.stats(); }

void GptTrainer::synchronize() const { impl_->compute.synchronize(); }

}  // namespace loom::gpu
