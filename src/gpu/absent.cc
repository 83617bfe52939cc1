// loom/gpu/gpu.h in a build without CUDA (LOOM_CUDA=OFF, or AUTO with no CUDA compiler
// found): no devices, and a trainer that cannot be made says why.
#include <algorithm>

#include "loom/core/error.h"
#include "loom/gpu/gpu.h"

namespace loom::gpu {

bool compiled() { return false; }
bool nccl_compiled() { return false; }

std::pair<int64_t, int64_t> zero_shard(int64_t numel, int rank, int ranks) {
  const int64_t s = (numel + ranks - 1) / ranks;
  return {std::min(numel, rank * s), std::min(numel, (rank + 1) * s)};
}
int device_count() { return 0; }
std::string device_description(int /*device*/) { return ""; }

namespace {

[[noreturn]] void no_cuda() {
  throw InputError(
      "job.device = \"cuda\": this loom was built without CUDA (configure with a CUDA compiler on PATH, "
      "scripts/setup.sh --cuda installs one; docs/gpu.md)");
}

}  // namespace

double bf16_gemm_tflops(int /*device*/, int64_t /*n*/) { no_cuda(); }
void require_device(int /*device*/) { no_cuda(); }

struct GptTrainer::Impl {};

GptTrainer::GptTrainer(const nn::Gpt& /*model*/, const GptTrainerConfig& /*config*/) { no_cuda(); }

// No trainer exists in this build, so nothing below is ever called on one.
[[noreturn]] void unreachable() { check_failed(__FILE__, __LINE__, "a GptTrainer in a build without CUDA"); }

GptTrainer::~GptTrainer() = default;
double GptTrainer::forward_backward(std::span<const int32_t>, std::span<const int32_t>, double) { unreachable(); }
double GptTrainer::step(double, comm::Communicator*, parallel::CommStats*) { unreachable(); }
int64_t GptTrainer::steps() const { unreachable(); }
parallel::CommStats GptTrainer::all_reduce_grads(comm::Communicator&) { unreachable(); }
parallel::CommStats GptTrainer::all_reduce_grads_nccl(comm::Communicator&) { unreachable(); }
parallel::CommStats GptTrainer::reduce_scatter_grads(comm::Communicator&) { unreachable(); }
void GptTrainer::copy_params_to(const ParamSet&) const { unreachable(); }
void GptTrainer::copy_grads_to(const ParamSet&) const { unreachable(); }
void GptTrainer::copy_params_from(const ParamSet&) { unreachable(); }
void GptTrainer::copy_moments_to(const Tensor&, const Tensor&) const { unreachable(); }
void GptTrainer::copy_moments_from(const Tensor&, const Tensor&, int64_t) { unreachable(); }
double GptTrainer::loss(std::span<const int32_t>, std::span<const int32_t>) { unreachable(); }
MemoryStats GptTrainer::memory() const { unreachable(); }
void GptTrainer::synchronize() const { unreachable(); }
std::vector<std::pair<std::string, double>> GptTrainer::phase_ms() { unreachable(); }
std::string GptTrainer::epilogues() const { unreachable(); }

}  // namespace loom::gpu
