// Loom on an NVIDIA GPU (docs/gpu.md): what the build and the machine have, and a GPT
// trainer that runs a whole training step on one GPU: bf16 activations and products with
// f32 master weights, gradients and accumulation; cuBLAS for the products, Loom's own
// kernels for the rest (src/gpu/kernels.h). Its parameters have the CPU model's flat layout
// (loom/core/params.h), so checkpoints and initialisation are the CPU's.
//
// Without a CUDA build (LOOM_CUDA off or no CUDA compiler), compiled() is false,
// device_count() is 0 and GptTrainer's constructor throws InputError saying so.
// Thread-safety: one thread drives a trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/params.h"
#include "loom/nn/gpt.h"
#include "loom/optim/optim.h"
#include "loom/parallel/parallelize.h"

namespace loom::comm {
class Communicator;
}

namespace loom::gpu {

bool compiled();
// Whether this build has NCCL (docs/gpu.md, "Data parallel"); false without CUDA.
bool nccl_compiled();
// CUDA devices this process sees; 0 without a CUDA build, a driver or a device.
int device_count();
// Throws, naming job.device, when `device` cannot be trained on: InputError in a build
// without CUDA, RuntimeError where no such device is visible.
void require_device(int device);
// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB"; "" when there is no such device.
std::string device_description(int device);

// The device memory a trainer's caching allocator holds: in_use by live buffers, reserved
// from CUDA (in use + cached for reuse), the peaks of both, how many buffers were asked
// for and how many of those the cache served.
struct MemoryStats {
  int64_t in_use = 0, reserved = 0, peak_in_use = 0, peak_reserved = 0;
  int64_t allocations = 0, cache_hits = 0;
};

// The best of a few timed bf16 products n x n x n (f32 accumulation, cuBLAS) on `device`,
// in TFLOP/s: the peak MFU is measured against, measured on the spot.
double bf16_gemm_tflops(int device, int64_t n = 8192);

// The attention's kernels (docs/gpu.md, "Attention"): kMma keeps the scores in registers
// (mma.sync, FlashAttention-2's layout), kWmma passes them through shared memory (WMMA);
// the same roundings, added in other orders. kMmaX4 is kMma's arithmetic, so its bits, with
// the scores' fragments loaded by ldmatrix.x4 and its dk/dv kernel at three blocks an SM.
enum class GpuAttention { kMma, kWmma, kMmaX4 };
// The names `loom bench gpu --attention` takes: "mma", "wmma", "mma-x4".
inline const char* gpu_attention_name(GpuAttention a) {
  return a == GpuAttention::kMma ? "mma" : a == GpuAttention::kWmma ? "wmma" : "mma-x4";
}

// ZeRO's shard of a flat buffer of `numel` elements for `rank` of `ranks` (docs/gpu.md, "Data
// parallel"): [rank * s, min(numel, (rank + 1) * s)) with s = ceil(numel / ranks), so that
// each rank's block of a gather or a scatter is s elements (the last padded with zeros).
std::pair<int64_t, int64_t> zero_shard(int64_t numel, int rank, int ranks);

struct GptTrainerConfig {
  int64_t micro_batch = 8;
  int64_t seq_len = 0;  // tokens per sequence; 0: the model's seq_len
  optim::OptimizerConfig optimizer;  // AdamW only
  double max_grad_norm = 1.0;        // 0: no clipping
  int device = 0;
  bool profile = false;  // time the step's phases (phase_ms); costs a wait per call
  GpuAttention attention = GpuAttention::kMma;
  // The products' epilogues (bias, residual, GELU, GELU's derivative, the bias gradients)
  // fused into the products on cuBLASLt where it has kernels for them; false: Loom's own
  // kernels after each product, as `loom bench gpu --epilogues kernels` compares.
  bool fused_epilogues = true;
  // ZeRO 1 and 2 with zero_ranks > 1: step() updates only zero_shard(numel, zero_rank,
  // zero_ranks) of the flat buffers, AdamW's moments are kept for that shard alone, and the
  // updated weights are all-gathered over the communicator step() is given.
  int zero_rank = 0, zero_ranks = 1;
};

class GptTrainer {
 public:
  // Copies the model's parameters (its current values) to the device. REQUIRES: an f32
  // model, whole (no pipeline part, no tensor parallelism). Throws InputError for a shape
  // the GPU kernels do not take (head size other than 32 or 64, d_model over 4096) or an
  // optimizer other than AdamW; RuntimeError when the device cannot be used; the out-of-
  // memory error names the buffer and the bytes asked.
  GptTrainer(const nn::Gpt& model, const GptTrainerConfig& config);
  ~GptTrainer();
  GptTrainer(const GptTrainer&) = delete;
  GptTrainer& operator=(const GptTrainer&) = delete;

  // Forward and backward of one micro-batch: tokens and targets (b, seq_len) i32 for any
  // b <= micro_batch, ids < vocab_size. Gradients add to the ones already there, scaled by
  // `scale` (1 / accumulation steps). Returns the micro-batch's mean loss.
  double forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets, double scale = 1.0);
  // Forward only (evaluation): the mean loss; the gradients are untouched.
  double loss(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  // Clips the gradients to max_grad_norm (PyTorch's clip_grad_norm_) and applies AdamW at
  // learning rate lr, then zeroes the gradients. Returns the gradient norm before clipping;
  // a norm that is not finite is returned with nothing updated or zeroed. With ZeRO
  // (config.zero_ranks > 1) `zero` is the communicator of those ranks: the norm is summed
  // over their shards, and the shards' new weights are all-gathered (their traffic added
  // to *stats when given). Collective over `zero` then.
  double step(double lr, comm::Communicator* zero = nullptr, parallel::CommStats* stats = nullptr);
  int64_t steps() const;
  // Data parallelism (docs/gpu.md, "Data parallel"): the gradients summed over comm's ranks
  // through pinned host memory, by Loom's transports: one copy to the host, all_reduce in
  // 16 MiB chunks, each chunk copied back as soon as its sum is in. Every rank ends with the
  // same bits. Returns what the exchange took. Collective over comm; nothing for one rank.
  parallel::CommStats all_reduce_grads(comm::Communicator& comm);
  // The same sum on the devices by NCCL's all-reduce, over an NCCL communicator made from
  // comm's ranks at the first call (rank 0's id sent through comm). REQUIRES: each rank on
  // its own device (NCCL refuses two ranks on one). RuntimeError without NCCL.
  parallel::CommStats all_reduce_grads_nccl(comm::Communicator& comm);
  // ZeRO 2: the gradients reduce-scattered over comm's ranks (through pinned memory as
  // above): this rank's zero_shard receives the sum, the rest of the gradient buffer is left
  // as it was (step() reads the shard alone). REQUIRES: config.zero_ranks = comm.size().
  parallel::CommStats reduce_scatter_grads(comm::Communicator& comm);

  // Parameters, gradients and AdamW's moments to and from host buffers of the model's
  // flat layout (ParamSet::values / grads; exp_avg and exp_avg_sq of params.numel(), of
  // which only the ZeRO shard is read or written under ZeRO).
  void copy_params_to(const ParamSet& params) const;
  void copy_grads_to(const ParamSet& params) const;
  void copy_params_from(const ParamSet& params);
  void copy_moments_to(const Tensor& exp_avg, const Tensor& exp_avg_sq) const;
  // A resume: AdamW's moments and the updates already done.
  void copy_moments_from(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t steps);

  MemoryStats memory() const;
  // With config.profile: milliseconds of device time by phase (embedding, each kind of
  // kernel, products forward and backward, optimizer) since the last call, in the order
  // the phases first ran.
  std::vector<std::pair<std::string, double>> phase_ms();
  // How the products' epilogues ran: on cuBLASLt (how many shapes fused, which declined)
  // or with Loom's kernels.
  std::string epilogues() const;
  // Waits for every queued kernel (for timing).
  void synchronize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `loom bench gpu`: GptTrainer's steps on random tokens, timed after warmup (each step
// forward, backward, clipping and AdamW, ended by its loss reaching the host), with
// tokens/s, model TFLOP/s and MFU against bf16_gemm_tflops, and the allocator's peaks.
struct BenchGpuArgs {
  std::string preset;  // for the table
  int64_t micro_batch = 16;
  int64_t steps = 20, warmup = 5;
  int device = 0;
  double peak_tflops = 0;  // 0: measure it
  bool profile = false;     // also the device time of each phase of a step
  GpuAttention attention = GpuAttention::kMma;
  bool fused_epilogues = true;  // GptTrainerConfig::fused_epilogues
};
int run_bench_gpu(const nn::GptConfig& model, const BenchGpuArgs& args);

// `loom train` with job.device = "cuda" (docs/gpu.md): the training step on a GPU behind
// the interface every layout's step has, so the trainer's books (metrics, evaluation,
// checkpoints, resume) are the CPU's: a checkpoint holds the logical tensors and AdamW's
// moments as a CPU run writes them, and a run moves between CPU and GPU, and between
// layouts, with --resume. Data parallel over `world`'s ranks (the gradients summed through
// pinned host memory by Loom's transports); rank i of a host takes its device i modulo the
// host's devices. `model` keeps the host copy of the weights (what checkpoints read);
// config.grad_clip, the optimizer and micro_batch are the step's. REQUIRES: a whole f32
// GPT (no tensor or pipeline parallelism). InputError for what the GPU does not run.
std::unique_ptr<parallel::Parallelized> parallelize_on_gpu(nn::Gpt& model, const parallel::StepConfig& config,
                                                           comm::Communicator& world);

}  // namespace loom::gpu
